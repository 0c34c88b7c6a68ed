/* mlp.c — a training loop of its own under DeadPool: a two-layer perceptron learns
 * y = sin(3x) + x/2 from noisy samples, data-parallel over the job's ranks.
 *
 * It differs from the built-in GPT-2 trainer in every way that matters to DeadPool:
 *   - no ZeRO: every rank holds all parameters and Adam moments (DP_IDENTICAL regions, which
 *     every rank keeps in its own snapshots; one copy is replicated, rank 0's);
 *   - the Adam moments are allocated at the first step, so the regions change over the run;
 *   - each rank reads its own sample stream whose cursor is NOT a function of the step
 *     (samples outside |x| <= 0.9 are rejected), so the cursor and the stream's RNG state
 *     travel as the generation's extra state.
 * With --plain the stream starts afresh at every step from (seed, step, rank): the state is
 * then DP_IDENTICAL only, no extra, as in plain data parallelism, where a rank has nothing of
 * its own. --hidden N sets the hidden width (default 32).
 * Run it with `deadpool run --workers 3 --spares 1 --steps 200 --seed 7 -- build/examples/mlp`;
 * it writes OUT/model.bin (a 16-byte header, then the parameters as float32). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deadpool.h"

#define BATCH 16                 /* samples per rank per step */
#define LR 0.01f

static int hidden = 32, nparams = 3 * 32 + 1; /* w1[H], b1[H], w2[H], b2 */
static int plain;                             /* --plain: samples are a function of the step */

enum { REGION_PARAMS = 1, REGION_M = 2, REGION_V = 3 };

typedef struct {
    uint64_t cursor;  /* samples drawn so far (accepted or not) */
    uint64_t rng;     /* xorshift state of the sample stream */
} Cursor;

typedef struct {
    dp_t *dp;
    uint64_t seed;
    float *params, *grads; /* grads[nparams]: the loss travels with the gradients */
    float *h;              /* hidden activations of one sample */
    float *m, *v;     /* Adam moments: NULL until the first step */
    Cursor cur;
} Mlp;

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float uniform(uint64_t *s) { return (float)(xorshift(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

static void init_state(Mlp *n) {
    uint64_t s = n->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < nparams; i++) n->params[i] = 0.5f * uniform(&s);
    free(n->m);
    free(n->v);
    n->m = n->v = NULL;
    n->cur = (Cursor){0, (n->seed + 1) * 0xD1B54A32D192ED03ULL + (uint64_t)dp_rank(n->dp) + 1};
}

/* The next accepted sample of this rank's stream. */
static void next_sample(Cursor *c, float *x, float *y) {
    do {
        *x = uniform(&c->rng);
        c->cursor++;
    } while (fabsf(*x) > 0.9f);
    *y = sinf(3.0f * *x) + 0.5f * *x + 0.05f * uniform(&c->rng);
}

/* Forward + backward of `step` over one batch: gradients (summed over the batch) and the loss
 * sum. */
static void forward_backward(Mlp *n, int64_t step) {
    const float *w1 = n->params, *b1 = w1 + hidden, *w2 = b1 + hidden, *b2 = w2 + hidden;
    float *gw1 = n->grads, *gb1 = gw1 + hidden, *gw2 = gb1 + hidden, *gb2 = gw2 + hidden;
    memset(n->grads, 0, (size_t)(nparams + 1) * sizeof(float));
    if (plain) /* nothing carried over from the previous step */
        n->cur = (Cursor){0, ((n->seed + 1) * 0xD1B54A32D192ED03ULL ^ (uint64_t)step * 0x9E3779B97F4A7C15ULL) +
                                 (uint64_t)dp_rank(n->dp) + 1};
    for (int s = 0; s < BATCH; s++) {
        float x, y, *h = n->h, out = *b2;
        next_sample(&n->cur, &x, &y);
        for (int j = 0; j < hidden; j++) {
            h[j] = tanhf(w1[j] * x + b1[j]);
            out += w2[j] * h[j];
        }
        float d = out - y; /* d(0.5 d^2)/d out */
        n->grads[nparams] += 0.5f * d * d;
        *gb2 += d;
        for (int j = 0; j < hidden; j++) {
            gw2[j] += d * h[j];
            float dh = d * w2[j] * (1.0f - h[j] * h[j]);
            gw1[j] += dh * x;
            gb1[j] += dh;
        }
    }
}

static int adam_update(Mlp *n, int64_t step, float scale) {
    if (!n->m) { /* allocated lazily, as many frameworks do */
        n->m = calloc((size_t)nparams, sizeof(float));
        n->v = calloc((size_t)nparams, sizeof(float));
        if (!n->m || !n->v) return -1;
    }
    float b1 = 0.9f, b2 = 0.999f, c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
    for (int i = 0; i < nparams; i++) {
        float g = n->grads[i] * scale;
        n->m[i] = b1 * n->m[i] + (1.0f - b1) * g;
        n->v[i] = b2 * n->v[i] + (1.0f - b2) * g * g;
        n->params[i] -= LR * (n->m[i] / c1) / (sqrtf(n->v[i] / c2) + 1e-8f);
    }
    return 0;
}

/* --- what DeadPool needs to know ------------------------------------------------------ */

static int regions(void *arg, dp_region *out, int max) {
    Mlp *n = arg;
    if (max < 3) return -1;
    int k = 0;
    out[k++] = (dp_region){REGION_PARAMS, DP_IDENTICAL, n->params, (size_t)nparams * sizeof(float)};
    if (n->m) {
        out[k++] = (dp_region){REGION_M, DP_IDENTICAL, n->m, (size_t)nparams * sizeof(float)};
        out[k++] = (dp_region){REGION_V, DP_IDENTICAL, n->v, (size_t)nparams * sizeof(float)};
    }
    return k;
}

static int restore(void *arg, const dp_generation *g, char *err, size_t errlen) {
    Mlp *n = arg;
    if (g->extra_len == sizeof n->cur) memcpy(&n->cur, g->extra, sizeof n->cur);
    for (int i = 0; i < g->nregions; i++) {
        const dp_region *r = &g->regions[i];
        if (r->len != (size_t)nparams * sizeof(float)) {
            snprintf(err, errlen, "region %u: expected %zu bytes, found %zu", r->id, (size_t)nparams * sizeof(float), r->len);
            return -1;
        }
        if (r->id != REGION_PARAMS && !n->m) {
            n->m = calloc((size_t)nparams, sizeof(float));
            n->v = calloc((size_t)nparams, sizeof(float));
            if (!n->m || !n->v) { snprintf(err, errlen, "out of memory"); return -1; }
        }
        float *to = r->id == REGION_PARAMS ? n->params : r->id == REGION_M ? n->m : n->v;
        memcpy(to, r->ptr, r->len);
    }
    return 0;
}

static void reset(void *arg) { init_state(arg); }

static int save(const char *path, const float *params, char *err, size_t errlen) {
    FILE *f = fopen(path, "wb");
    uint32_t head[4] = {0x504C4D44u /* "DMLP" */, 1, (uint32_t)hidden, (uint32_t)nparams};
    int ok = f && fwrite(head, sizeof head, 1, f) == 1 && fwrite(params, sizeof(float), (size_t)nparams, f) == (size_t)nparams;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) snprintf(err, errlen, "%s: cannot write the model", path);
    return ok ? 0 : -1;
}

static int keep_params(void *arg, const dp_generation *g) {
    for (int i = 0; i < g->nregions; i++)
        if (g->regions[i].id == REGION_PARAMS) {
            memcpy(arg, g->regions[i].ptr, (size_t)nparams * sizeof(float));
            return 0;
        }
    return -1;
}

/* A checkpoint: the parameters are in rank 0's state (the only one that carries identical
 * regions to its holders and to disk). */
static int checkpoint(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen) {
    (void)arg, (void)step, (void)world;
    float *params = malloc((size_t)nparams * sizeof(float));
    char path[4200];
    int rc = -1;
    if (!params) snprintf(err, errlen, "out of memory");
    else if (dp_checkpoint_read(dir, 0, keep_params, params, err, errlen) == 0) {
        snprintf(path, sizeof path, "%s/model.bin", dir);
        rc = save(path, params, err, errlen);
    }
    free(params);
    return rc;
}

/* --plain, --hidden N. 0, or -1 with the problem on stderr. */
static int parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--plain")) plain = 1;
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc && (hidden = (int)strtol(argv[++i], &end, 10), *end == 0) &&
                 hidden >= 1 && hidden <= (1 << 20))
            nparams = 3 * hidden + 1;
        else {
            fprintf(stderr, "mlp: unknown or bad argument '%s' (expected --plain, --hidden N with N in 1..%d)\n", argv[i],
                    1 << 20);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    char err[1024];
    static Mlp net;
    if (parse_args(argc, argv) != 0) return 2;
    net.params = malloc((size_t)nparams * sizeof(float));
    net.grads = malloc((size_t)(nparams + 1) * sizeof(float));
    net.h = malloc((size_t)hidden * sizeof(float));
    if (!net.params || !net.grads || !net.h) { fprintf(stderr, "mlp: out of memory\n"); return 1; }
    dp_t *dp = dp_init(NULL, err, sizeof err);                          /* DeadPool: join the job */
    if (!dp) { fprintf(stderr, "mlp: %s\n", err); return dp_finish(NULL, DP_ERR); }
    net.dp = dp;
    net.seed = dp_seed(dp);
    init_state(&net);
    dp_callbacks cb = {.regions = regions, .restore = restore, .reset = reset, .checkpoint = checkpoint, .arg = &net};
    dp_status st = dp_join(dp, &cb, err, sizeof err);                  /* DeadPool: spares wait here */
    while (st == DP_OK) {
        for (int64_t step = dp_next_step(dp); step < dp_steps(dp) && st == DP_OK; step++) {
            forward_backward(&net, step);
            st = dp_step_before_reduce(dp, step);                      /* DeadPool */
            if (st == DP_OK) st = dp_allreduce_mean(dp, net.grads, (size_t)nparams + 1); /* the loss too */
            if (st == DP_OK) st = dp_step_before_update(dp);           /* DeadPool */
            if (st != DP_OK) break;
            float scale = 1.0f / BATCH; /* the mean over ranks of per-rank sums over the batch */
            if (adam_update(&net, step, scale) != 0) { st = DP_ERR; break; }
            dp_metrics m = {.loss = net.grads[nparams] * scale, .lr = LR, .tokens = BATCH * dp_world(dp)};
            st = dp_step_commit(dp, step, plain ? NULL : &net.cur, plain ? 0 : sizeof net.cur, &m); /* DeadPool */
        }
        if (st != DP_FAILED) break;
        st = dp_recover(dp, err, sizeof err);                          /* DeadPool: roll back, go on */
    }
    if (st == DP_OK && dp_rank(dp) == 0) {
        char path[1200];
        snprintf(path, sizeof path, "%s/model.bin", dp_out_dir(dp));
        if (save(path, net.params, err, sizeof err) != 0) { dp_log(dp, "%s", err); st = DP_ERR; }
        else dp_output_saved(dp, path);
    }
    int rc = dp_finish(dp, st);                                        /* DeadPool: leave */
    free(net.m); /* after dp_finish: a snapshot in flight may still read the state */
    free(net.v);
    free(net.params);
    free(net.grads);
    free(net.h);
    return rc;
}
