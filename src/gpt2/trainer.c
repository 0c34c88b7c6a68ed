/* trainer.c — model + data + sharded AdamW state of one rank, the step that ties them to
 * DeadPool's collectives, and the callbacks through which DeadPool snapshots, restores and
 * checkpoints it. */
#include "trainer.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "layout.h"
#include "modelfile.h"
#include "optimizer.h"
#include "util.h"

/* Region ids of the state DeadPool keeps for us. */
enum { REGION_PARAMS = 1, REGION_M = 2, REGION_V = 3 };

struct Trainer {
    TrainOptions opt_cfg;
    dp_t *dp;
    int size;           /* ranks */
    int B, T;
    uint64_t seed;
    GPT2 *model;
    GPT2Config mc;
    DataSet *data;
    size_t shard;       /* parameters owned per rank: ceil(the largest part / data-parallel degree) */
    /* This rank's shard of the parameters and its AdamW moments live in DeadPool's buffers
     * (dp_state: one per generation parity): the update reads one and writes the other. */
    int *inputs, *targets;
    AdamWConfig opt;
    /* Model parallelism (--tp x --pp > 1): this rank's coordinate and part (built for the rank
     * it holds: a spare builds it when it takes one), its groups of the current epoch, one set
     * of activations per micro-batch in flight, and the pipeline's buffers. */
    Layout lay;
    int mp;              /* tp * pp > 1 */
    int model_rank;      /* the rank the model part was built for, -1 before */
    Coord at;
    GPT2Part part;
    GPT2 **slots;        /* slots[0] = model; micro-batch i uses slots[i % nslots] */
    int nslots;
    dp_group *g_tp, *g_pp, *g_dp;
    long groups_epoch;   /* the epoch the groups belong to, -1 for none */
    dp_status hook_st;   /* of the last tensor-parallel allreduce (called from inside the model) */
    float *x_in, *dout, *act_send, *grad_send, *wte_peer; /* (B,T,C), A x (B,T,C) each, the peer's wte gradient */
    float *full;         /* the whole model assembled for the model file (trainer_gather_model) */
    char model_file[4200]; /* where the initial parameters come from, when from_file */
    int from_file;
    int broken;          /* a callback could not build the state (out of memory): the next step says so */
};

/* Where the initial parameters come from: a resumed checkpoint, a model file, or a preset. */
static int load_model_config(const TrainOptions *o, const char *resume_dir, char *model_file, size_t len,
                             GPT2Config *mc, int *from_file, char *err, size_t errlen) {
    *from_file = 1;
    /* A checkpoint split over machines' disks has no model.bin: the shape comes from --model,
     * the parameters from the ranks' restored shards (gathered by the rebuild). */
    if (resume_dir) snprintf(model_file, len, "%s/model.bin", resume_dir);
    if (resume_dir && access(model_file, R_OK) == 0) return modelfile_read_config(model_file, mc, err, errlen);
    snprintf(model_file, len, "%s", o->model);
    *from_file = 0;
    if (gpt2_preset(o->model, mc) == 0) return 0;
    if (strchr(o->model, '/') == NULL && strchr(o->model, '.') == NULL) {
        snprintf(err, errlen, "--model: '%s' is neither a preset (micro, tiny, small, gpt2-124m) nor a file", o->model);
        return -1;
    }
    *from_file = 1;
    return modelfile_read_config(o->model, mc, err, errlen);
}

static AdamWConfig optimizer_config(const TrainOptions *o, int steps) {
    AdamWConfig a = adamw_defaults();
    a.lr = o->lr;
    a.weight_decay = o->weight_decay;
    a.grad_clip = o->grad_clip;
    a.warmup_steps = o->warmup;
    a.total_steps = steps;
    a.final_lr_frac = o->final_lr_frac;
    return a;
}

static int aborted(const void *arg) { return dp_aborted(arg); }

/* The data-parallel replica this rank belongs to: its micro-batches and its shard's place. */
static int dp_index(const Trainer *t) { return t->mp ? t->at.d : (dp_rank(t->dp) > 0 ? dp_rank(t->dp) : 0); }

/* Generation -1: this rank's shard of the initial parameters, zero moments (a spare, whose
 * rank is not known yet, gets shard 0: it restores before it trains). */
static void initial_state(Trainer *t) {
    size_t bytes = t->shard * sizeof(float);
    memcpy(dp_state(t->dp, REGION_PARAMS, -1), gpt2_params(t->model) + (size_t)dp_index(t) * t->shard, bytes);
    memset(dp_state(t->dp, REGION_M, -1), 0, bytes);
    memset(dp_state(t->dp, REGION_V, -1), 0, bytes);
}

/* --- model parallelism: the part, the groups, the pipeline's buffers ------------------- */

static int tp_hook(void *arg, float *buf, size_t n) {
    Trainer *t = arg;
    t->hook_st = dp_group_allreduce_sum(t->g_tp, buf, n);
    return t->hook_st == DP_OK ? 0 : -1;
}

static void free_part(Trainer *t) {
    for (int i = t->nslots - 1; i >= 0 && t->slots; i--) gpt2_free(t->slots[i]);
    free(t->slots);
    t->slots = NULL;
    t->nslots = 0;
    t->model = NULL;
    free(t->x_in), free(t->dout), free(t->act_send), free(t->grad_send), free(t->wte_peer);
    t->x_in = t->dout = t->act_send = t->grad_send = t->wte_peer = NULL;
    t->model_rank = -1;
}

/* The initial parameters into this rank's model: the model file's (a --model file or the
 * resumed checkpoint's model.bin), else the preset's initialisation; a part takes its slice of
 * the whole model's. 0 / -1 + err. */
static int load_initial_params(Trainer *t, char *err, size_t errlen) {
    GPT2Config mc = t->mc;
    size_t n = gpt2_num_params(&t->mc);
    if (!t->from_file) {
        if (gpt2_init_params(t->model, t->seed) == 0) return 0; /* a part keeps its slice of the whole */
        snprintf(err, errlen, "out of memory for the model's %zu parameters", n);
        return -1;
    }
    if (!t->mp) return modelfile_read(t->model_file, &mc, gpt2_params(t->model), err, errlen);
    float *full = malloc(n * sizeof(float));
    if (!full) { snprintf(err, errlen, "out of memory for the model's %zu parameters", n); return -1; }
    int rc = modelfile_read(t->model_file, &mc, full, err, errlen);
    if (rc == 0) gpt2_load_full(t->model, full);
    free(full);
    return rc;
}

/* Builds this rank's part (coordinate of dp_rank), its micro-batch slots and buffers; its
 * parameters are loaded or restored afterwards. 0 / -1 + err. */
static int build_part(Trainer *t, char *err, size_t errlen) {
    int rank = dp_rank(t->dp);
    if (t->model && t->model_rank == rank) return 0;
    free_part(t);
    t->at = layout_coord(&t->lay, rank);
    t->part = layout_part(&t->lay, &t->mc, t->at);
    /* 1F1B keeps at most pp - p micro-batches in flight on stage p (see pipeline) */
    int A = t->opt_cfg.grad_accum, inflight = t->lay.pp - t->at.p;
    t->nslots = A < inflight ? A : inflight;
    t->slots = calloc((size_t)t->nslots, sizeof *t->slots);
    size_t btc = (size_t)t->B * t->T * t->mc.channels;
    if (t->slots) t->slots[0] = gpt2_create_part(&t->mc, &t->part, t->B, t->T, t->shard * (size_t)t->lay.dp);
    t->model = t->slots ? t->slots[0] : NULL;
    int ok = t->model != NULL;
    for (int i = 1; i < t->nslots && ok; i++) ok = (t->slots[i] = gpt2_create_sibling(t->model)) != NULL;
    /* what this stage sends and receives: one buffer per micro-batch and direction, so that a
     * posted send's bytes stay put until the end of the step */
    int first = t->at.p == 0, last = t->at.p == t->lay.pp - 1;
    if (!first) t->x_in = malloc(btc * sizeof(float));
    if (!last) t->dout = malloc(btc * sizeof(float));
    if (!last) t->act_send = malloc((size_t)A * btc * sizeof(float));
    if (!first) t->grad_send = malloc((size_t)A * btc * sizeof(float));
    if (t->lay.pp > 1 && (first || last)) t->wte_peer = malloc((size_t)t->mc.padded_vocab_size * t->mc.channels * sizeof(float));
    if (!ok || (!first && (!t->x_in || !t->grad_send)) || (!last && (!t->dout || !t->act_send)) ||
        (t->lay.pp > 1 && (first || last) && !t->wte_peer)) {
        snprintf(err, errlen, "out of memory allocating stage %d, slice %d of the model (%d micro-batches in flight)",
                 t->at.p, t->at.t, t->nslots);
        free_part(t);
        return -1;
    }
    for (int i = 0; i < t->nslots; i++) {
        gpt2_set_tp_allreduce(t->slots[i], tp_hook, t);
        gpt2_set_abort_check(t->slots[i], aborted, t->dp);
    }
    t->model_rank = rank;
    return 0;
}

/* A spare learns its coordinate when it takes a rank: it builds that part then (its
 * parameters come from the restore, or the reset initialises them). */
static dp_status ensure_part(Trainer *t) {
    if (!t->mp || (t->model && t->model_rank == dp_rank(t->dp))) return DP_OK;
    char err[512];
    if (build_part(t, err, sizeof err) != 0) {
        dp_log(t->dp, "%s", err);
        t->broken = 1;
        return DP_ERR;
    }
    return DP_OK;
}

/* The epoch's groups: tensor (same d, p), pipeline (same d, t), data-parallel (same p, t),
 * joined in that order on every rank. */
static dp_status ensure_groups(Trainer *t) {
    if (!t->mp || t->groups_epoch == dp_epoch(t->dp)) return DP_OK;
    char name[64], err[512];
    Coord c = t->at;
    snprintf(name, sizeof name, "tp.%d.%d", c.d, c.p);
    t->g_tp = dp_group_join(t->dp, name, c.t, t->lay.tp, err, sizeof err);
    snprintf(name, sizeof name, "pp.%d.%d", c.d, c.t);
    if (t->g_tp) t->g_pp = dp_group_join(t->dp, name, c.p, t->lay.pp, err, sizeof err);
    snprintf(name, sizeof name, "dp.%d.%d", c.p, c.t);
    if (t->g_tp && t->g_pp) t->g_dp = dp_group_join(t->dp, name, c.d, t->lay.dp, err, sizeof err);
    if (!t->g_tp || !t->g_pp || !t->g_dp) {
        dp_log(t->dp, "%s", err);
        return DP_FAILED; /* a member is missing: the coordinator decides again */
    }
    t->groups_epoch = dp_epoch(t->dp);
    return DP_OK;
}

Trainer *trainer_create(const TrainOptions *o, dp_t *dp, char *err, size_t errlen) {
    Trainer *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return NULL; }
    GPT2Config mc;
    Layout lay;
    if (load_model_config(o, dp_resume_dir(dp), t->model_file, sizeof t->model_file, &mc, &t->from_file, err, errlen) != 0)
        goto fail;
    int T = o->seq_len ? o->seq_len : mc.max_seq_len;
    if (T > mc.max_seq_len) {
        snprintf(err, errlen, "--seq-len: expected <= the model's max_seq_len %d, found %d", mc.max_seq_len, T);
        goto fail;
    }
    if (layout_make(dp_world(dp), o->tp, o->pp, &mc, &lay, err, errlen) != 0) goto fail;
    t->opt_cfg = *o;
    t->dp = dp;
    t->size = dp_world(dp);
    t->seed = dp_seed(dp);
    t->B = o->batch;
    t->T = T;
    t->mc = mc;
    t->lay = lay;
    t->mp = lay.tp * lay.pp > 1;
    t->model_rank = -1;
    t->groups_epoch = -1;
    t->opt = optimizer_config(o, (int)dp_steps(dp));

    t->data = o->data[0] ? data_open(o->data, mc.vocab_size, err, errlen) : data_builtin(1 << 20);
    if (!t->data) goto fail;
    if (data_num_tokens(t->data) <= (size_t)T) {
        snprintf(err, errlen, "%s: %zu tokens, need more than seq_len %d", o->data, data_num_tokens(t->data), T);
        goto fail;
    }
    /* Every rank's state has the same size, the largest part's shard, so that a spare can
     * declare it before it knows which coordinate it will take. */
    size_t largest = 0;
    for (int p = 0; p < lay.pp; p++) {
        GPT2Part q = layout_part(&lay, &mc, (Coord){0, p, 0});
        size_t n = gpt2_part_num_params(&mc, &q);
        if (n > largest) largest = n;
    }
    t->shard = (largest + (size_t)lay.dp - 1) / (size_t)lay.dp;
    size_t bytes = t->shard * sizeof(float);
    dp_state_spec state[3] = {{REGION_PARAMS, bytes}, {REGION_M, bytes}, {REGION_V, bytes}};
    if (dp_state_declare(dp, state, 3, err, errlen) != DP_OK) goto fail;
    if (t->mp) dp_replica_spread(dp, lay.tp * lay.dp); /* a pipeline stage: replicas in other stages */
    t->inputs = malloc((size_t)t->B * T * sizeof(int));
    t->targets = malloc((size_t)t->B * T * sizeof(int));
    if (!t->inputs || !t->targets) { snprintf(err, errlen, "out of memory"); goto fail; }
    /* a spare of a 3D job builds its part once it has a rank (ensure_part) */
    if (t->mp && dp_rank(dp) >= 0 && build_part(t, err, errlen) != 0) goto fail;
    if (!t->mp) {
        t->model = gpt2_create(&mc, t->B, T, t->shard * (size_t)t->size);
        if (!t->model) {
            snprintf(err, errlen, "out of memory allocating the model (%zu parameters, batch %d x %d)", largest, t->B, T);
            goto fail;
        }
        gpt2_set_abort_check(t->model, aborted, dp);
    }
    if (t->model) {
        if (load_initial_params(t, err, errlen) != 0) goto fail;
        initial_state(t);
    }
    openblas_set_num_threads(o->threads);
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(Trainer *t) {
    if (!t) return;
    if (t->mp) free_part(t);
    else gpt2_free(t->model);
    data_free(t->data);
    free(t->inputs);
    free(t->targets);
    free(t->full);
    free(t);
}

/* --- DeadPool callbacks --------------------------------------------------------------- */

/* All of the state is declared (dp_state): nothing else to report. */
static int regions_cb(void *arg, dp_region *out, int max) {
    (void)arg, (void)out, (void)max;
    return 0;
}

/* Back to the initial parameters: the model file's when the job started from one, else the
 * preset's initialisation. A failure (out of memory, the file gone) is said here and stops
 * the next step: training on from anything else would be a silently different model. */
static void reset_cb(void *arg) {
    Trainer *t = arg;
    char err[1024];
    if (ensure_part(t) != DP_OK) return;
    if (load_initial_params(t, err, sizeof err) != 0) {
        dp_log(t->dp, "resetting to the initial model: %s", err);
        t->broken = 1;
        return;
    }
    initial_state(t);
}

/* Every rank restored its own shard: the parameters of its part are the concatenation of its
 * data-parallel group's shards (with one replica, its own shard is the whole part). */
static dp_status rebuild_cb(dp_t *dp, void *arg) {
    Trainer *t = arg;
    const float *shard = dp_state(dp, REGION_PARAMS, dp_next_step(dp) - 1);
    if (!t->mp) return dp_allgather(dp, shard, gpt2_params(t->model), t->shard);
    dp_status st = ensure_part(t);
    if (st == DP_OK) st = ensure_groups(t);
    if (st == DP_OK) st = dp_group_allgather(t->g_dp, shard, gpt2_params(t->model), t->shard);
    return st;
}

/* The whole model from every rank's parameter shard (all[r * shard ..], rank-major), malloc'ed
 * (NULL without memory): each part is its data-parallel group's shards end to end. */
static float *assemble_full(const Trainer *t, const float *all) {
    float *full = malloc(gpt2_num_params(&t->mc) * sizeof(float));
    float *part_buf = malloc(t->shard * (size_t)t->lay.dp * sizeof(float));
    for (int p = 0; p < t->lay.pp && full && part_buf; p++)
        for (int ts = 0; ts < t->lay.tp; ts++) {
            for (int d = 0; d < t->lay.dp; d++)
                memcpy(part_buf + (size_t)d * t->shard, all + (size_t)layout_rank(&t->lay, (Coord){d, p, ts}) * t->shard,
                       t->shard * sizeof(float));
            GPT2Part q = layout_part(&t->lay, &t->mc, (Coord){0, p, ts});
            gpt2_part_map(&t->mc, &q, full, part_buf, 0);
        }
    if (!part_buf) { free(full); full = NULL; }
    free(part_buf);
    return full;
}

typedef struct {
    float *params;
    size_t shard;
    int rank;
} ShardCopy;

static int copy_params_shard(void *arg, const dp_generation *g) {
    ShardCopy *c = arg;
    for (int i = 0; i < g->nregions; i++)
        if (g->regions[i].id == REGION_PARAMS && g->regions[i].len == c->shard * sizeof(float)) {
            memcpy(c->params + (size_t)c->rank * c->shard, g->regions[i].ptr, g->regions[i].len);
            return 0;
        }
    return -1;
}

/* A checkpoint's model.bin: the whole model from every rank's parameter shard. Reads only the
 * state files and the immutable layout (this may run on DeadPool's snapshot thread). */
static int checkpoint_cb(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen) {
    Trainer *t = arg;
    (void)step;
    float *all = malloc(t->shard * (size_t)world * sizeof(float)), *full = NULL;
    if (!all) { snprintf(err, errlen, "out of memory for the checkpoint's model"); return -1; }
    int rc = 0;
    for (int r = 0; r < world && rc == 0; r++) {
        ShardCopy c = {all, t->shard, r};
        rc = dp_checkpoint_read(dir, r, copy_params_shard, &c, err, errlen);
        if (rc != 0 && !err[0]) snprintf(err, errlen, "%s: rank %d's state has no parameter shard of %zu floats", dir, r, t->shard);
    }
    /* without model parallelism the shards end to end are the model */
    if (rc == 0 && t->mp && !(full = assemble_full(t, all))) {
        snprintf(err, errlen, "out of memory for the checkpoint's model");
        rc = -1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (rc == 0) rc = modelfile_write(path, &t->mc, t->mp ? full : all, err, errlen);
    free(all), free(full);
    return rc;
}

dp_callbacks trainer_callbacks(Trainer *t) {
    return (dp_callbacks){.regions = regions_cb, .restore = NULL, .reset = reset_cb, .rebuild = rebuild_cb,
                          .checkpoint = checkpoint_cb, .arg = t};
}

/* --- the step ------------------------------------------------------------------------- */

/* Forward + backward over this rank's micro-batches; returns the sum of their mean losses. */
static float accumulate_gradients(Trainer *t, int rank, int step) {
    int A = t->opt_cfg.grad_accum;
    float loss_sum = 0.0f;
    gpt2_zero_grad(t->model);
    for (int a = 0; a < A; a++) {
        data_batch(t->data, t->seed, step, rank * A + a, t->B, t->T, t->inputs, t->targets);
        loss_sum += gpt2_forward(t->model, t->inputs, t->targets, t->B, t->T);
        if (dp_aborted(t->dp)) break;
        gpt2_backward(t->model, 1.0f);
    }
    return loss_sum;
}

/* Why a forward or backward of a part stopped: its tensor-parallel allreduce failed, or the
 * epoch was closed under it (a recovery follows); anything else is an error of this program
 * (a recovery would compute the same again). */
static dp_status part_failed(Trainer *t, const char *what) {
    if (t->hook_st != DP_OK) return t->hook_st;
    if (dp_aborted(t->dp)) return DP_FAILED;
    dp_log(t->dp, "the %s of stage %d failed (see above)", what, t->at.p);
    return DP_ERR;
}

/* Micro-batch i forward on this stage: the input from the previous stage (or the tokens),
 * the output to the next (or the loss). Tags: 2i forward, 2i+1 backward. */
static dp_status stage_forward(Trainer *t, int step, int i, float *loss_sum) {
    GPT2 *m = t->slots[i % t->nslots];
    size_t btc = (size_t)t->B * t->T * t->mc.channels;
    int p = t->at.p, last = p == t->lay.pp - 1;
    dp_status st = DP_OK;
    if (p == 0 || last) /* the first stage embeds the tokens, the last one scores them */
        data_batch(t->data, t->seed, step, t->at.d * t->opt_cfg.grad_accum + i, t->B, t->T, t->inputs, t->targets);
    if (p > 0) st = dp_group_recv(t->g_pp, t->x_in, btc * sizeof(float), p - 1, 2u * i);
    if (st != DP_OK) return st;
    float loss = gpt2_forward_part(m, t->inputs, t->targets, p > 0 ? t->x_in : NULL, t->B, t->T);
    if (t->hook_st != DP_OK || (loss != loss && (!last || dp_aborted(t->dp)))) return part_failed(t, "forward");
    if (last) {
        *loss_sum += loss; /* a NaN loss goes on as in data parallelism: the commit refuses a diverged step */
        return DP_OK;
    }
    float *out = t->act_send + (size_t)i * btc; /* stays until the sends are waited for */
    memcpy(out, gpt2_part_output(m), btc * sizeof(float));
    return dp_group_send(t->g_pp, out, btc * sizeof(float), p + 1, 2u * i);
}

static dp_status stage_backward(Trainer *t, int i) {
    GPT2 *m = t->slots[i % t->nslots];
    size_t btc = (size_t)t->B * t->T * t->mc.channels;
    int p = t->at.p, last = p == t->lay.pp - 1;
    dp_status st = DP_OK;
    if (!last) st = dp_group_recv(t->g_pp, t->dout, btc * sizeof(float), p + 1, 2u * i + 1);
    if (st != DP_OK) return st;
    if (gpt2_backward_part(m, 1.0f, last ? NULL : t->dout) != 0) return part_failed(t, "backward");
    if (p == 0) return DP_OK;
    float *g = t->grad_send + (size_t)i * btc;
    memcpy(g, gpt2_part_dinput(m), btc * sizeof(float));
    return dp_group_send(t->g_pp, g, btc * sizeof(float), p - 1, 2u * i + 1);
}

/* The step's A micro-batches through the stages in a 1F1B schedule: stage p runs
 * pp - p - 1 forwards ahead, then alternates one forward and one backward, then drains the
 * backwards; so at most pp - p micro-batches are in flight there (their activations in
 * slots), and every stage is busy once the pipeline is full. Returns the last stage's sum of
 * micro-batch losses (0 elsewhere). */
static dp_status pipeline(Trainer *t, int step, float *loss_sum) {
    int A = t->opt_cfg.grad_accum, warm = t->lay.pp - t->at.p - 1, nf = 0, nb = 0;
    if (warm > A) warm = A;
    dp_status st = DP_OK;
    t->hook_st = DP_OK;
    *loss_sum = 0.0f;
    gpt2_zero_grad(t->model);
    while (st == DP_OK && nf < warm) st = stage_forward(t, step, nf++, loss_sum);
    while (st == DP_OK && nf < A) {
        st = stage_forward(t, step, nf++, loss_sum);
        if (st == DP_OK) st = stage_backward(t, nb++);
    }
    while (st == DP_OK && nb < A) st = stage_backward(t, nb++);
    if (st == DP_OK) st = dp_group_wait_sends(t->g_pp);
    return st;
}

/* The tied embedding's gradient: the first stage's (embedding) plus the last's (logits), the
 * same sum on both (a + b == b + a in IEEE arithmetic). */
static dp_status sum_tied_embedding(Trainer *t) {
    int p = t->at.p, P = t->lay.pp;
    if (P == 1 || (p != 0 && p != P - 1)) return DP_OK;
    size_t n;
    float *g = gpt2_wte_grad(t->model, &n);
    int peer = p == 0 ? P - 1 : 0;
    const uint32_t tag = 0x7fffffffu;
    dp_status st = dp_group_send(t->g_pp, g, n * sizeof(float), peer, tag);
    if (st == DP_OK) st = dp_group_recv(t->g_pp, t->wte_peer, n * sizeof(float), peer, tag);
    if (st == DP_OK) st = dp_group_wait_sends(t->g_pp);
    for (size_t i = 0; i < n && st == DP_OK; i++) g[i] += t->wte_peer[i];
    return st;
}

/* The optimizer on this rank's shard and the allgather that gives every rank its parameters
 * back, then the commit. */
static dp_status update_and_commit(Trainer *t, int step, float loss, double norm, int micro_batches) {
    dp_t *dp = t->dp;
    float avg = 1.0f / (float)micro_batches;
    float lr = adamw_lr(&t->opt, step);
    size_t off = (size_t)dp_index(t) * t->shard;
    /* Out of place: generation step - 1 in, generation step out, into DeadPool's other buffer. */
    float *p_out = dp_state(dp, REGION_PARAMS, step);
    adamw_update(p_out, dp_state(dp, REGION_PARAMS, step - 1), gpt2_grads(t->model) + off, dp_state(dp, REGION_M, step),
                 dp_state(dp, REGION_M, step - 1), dp_state(dp, REGION_V, step), dp_state(dp, REGION_V, step - 1),
                 t->shard, &t->opt, lr, avg * grad_clip_scale(&t->opt, norm), step + 1);
    dp_status st = t->mp ? dp_group_allgather(t->g_dp, p_out, gpt2_params(t->model), t->shard)
                         : dp_allgather(dp, p_out, gpt2_params(t->model), t->shard);
    if (st != DP_OK) return st;
    dp_metrics m = {.loss = loss / (float)micro_batches, .lr = lr, .grad_norm = norm,
                    .tokens = (double)micro_batches * t->B * t->T};
    return dp_step_commit(dp, step, NULL, 0, &m);
}

static dp_status trainer_step_dp(Trainer *t, int step) {
    dp_t *dp = t->dp;
    float *grads = gpt2_grads(t->model);
    size_t padded = t->shard * (size_t)t->size;

    float loss = accumulate_gradients(t, dp_rank(dp), step);
    dp_status st = dp_step_before_reduce(dp, step);
    if (st == DP_OK) st = dp_allreduce_sum(dp, grads, padded);
    if (st == DP_OK) st = dp_allreduce_sum(dp, &loss, 1);
    if (st == DP_OK) st = dp_step_before_update(dp);
    if (st != DP_OK) return st;

    /* Gradients are now sums over N*A micro-batch means: average them. */
    int micro_batches = t->size * t->opt_cfg.grad_accum;
    double norm = grad_global_norm(grads, gpt2_num_params(&t->mc)) * (1.0f / (float)micro_batches);
    return update_and_commit(t, step, loss, norm, micro_batches);
}

/* A step of a 3D-parallel job: the pipeline, the tied embedding's sum, the data-parallel
 * reduction within the (p, t) group, then the loss and the squared norm summed over all ranks
 * in one allreduce (each parameter counted on one part, and once per replica: hence / dp). */
static dp_status trainer_step_mp(Trainer *t, int step) {
    dp_t *dp = t->dp;
    float loss = 0.0f;
    dp_status st = ensure_part(t);
    if (st == DP_OK) st = ensure_groups(t);
    if (st == DP_OK) st = pipeline(t, step, &loss);
    if (st == DP_OK) st = dp_step_before_reduce(dp, step);
    if (st == DP_OK) st = sum_tied_embedding(t);
    if (st == DP_OK) st = dp_group_allreduce_sum(t->g_dp, gpt2_grads(t->model), t->shard * (size_t)t->lay.dp);
    float red[2] = {t->at.p == t->lay.pp - 1 && t->at.t == 0 ? loss : 0.0f, 0.0f};
    if (st == DP_OK) {
        red[1] = (float)gpt2_part_grad_sumsq(t->model);
        st = dp_allreduce_sum(dp, red, 2);
    }
    if (st == DP_OK) st = dp_step_before_update(dp);
    if (st != DP_OK) return st;
    int micro_batches = t->lay.dp * t->opt_cfg.grad_accum;
    double norm = sqrt((double)red[1] / t->lay.dp) / micro_batches;
    return update_and_commit(t, step, red[0], norm, micro_batches);
}

dp_status trainer_train(Trainer *t) {
    if (t->broken) return DP_ERR; /* said when it happened */
    for (int64_t step = dp_next_step(t->dp); step < dp_steps(t->dp); step++) {
        dp_status st = t->mp ? trainer_step_mp(t, (int)step) : trainer_step_dp(t, (int)step);
        if (st != DP_OK) return st;
    }
    return DP_OK;
}

dp_status trainer_gather_model(Trainer *t) {
    if (!t->mp) return DP_OK; /* every rank holds the whole model */
    dp_status st = ensure_part(t);
    float *all = malloc(t->shard * (size_t)t->size * sizeof(float));
    if (!all) st = DP_ERR;
    if (st == DP_OK) st = dp_allgather(t->dp, dp_state(t->dp, REGION_PARAMS, dp_next_step(t->dp) - 1), all, t->shard);
    free(t->full);
    t->full = st == DP_OK ? assemble_full(t, all) : NULL;
    if (st == DP_OK && !t->full) st = DP_ERR;
    free(all);
    return st;
}

int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen) {
    if (t->mp && !t->full) { snprintf(err, errlen, "the model was not gathered"); return -1; }
    return modelfile_write(path, &t->mc, t->mp ? t->full : gpt2_params(t->model), err, errlen);
}

/* --- the program ---------------------------------------------------------------------- */

/* The trained model goes to OUT/model.bin; if that fails (a full disk, say), to a directory of
 * its own in the temporary directory, saying where: the work is not lost for want of room in
 * --out. That directory is new, private (mkdtemp: mode 0700) and its name unpredictable, so
 * nobody can have planted a link where the model goes, in /tmp least of all. */
static dp_status save_final_model(Trainer *t, dp_t *dp) {
    char path[1200], err[1024], err2[1024] = "";
    snprintf(path, sizeof path, "%s/model.bin", dp_out_dir(dp));
    if (trainer_save_model(t, path, err, sizeof err) == 0) {
        dp_output_saved(dp, path);
        return DP_OK;
    }
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char rescue[1200];
    snprintf(rescue, sizeof rescue, "%.1000s/deadpool-model-XXXXXX", tmp);
    if (!mkdtemp(rescue)) snprintf(err2, sizeof err2, "cannot create a directory: %s", strerror(errno));
    else strcat(rescue, "/model.bin");
    if (!err2[0] && trainer_save_model(t, rescue, err2, sizeof err2) == 0) {
        dp_log(dp, "%s; the model was written to %s instead", err, rescue);
        dp_output_saved(dp, rescue);
        return DP_OK;
    }
    dp_log(dp, "%s; writing it to %s failed too (%s): the model is lost, the newest checkpoint in %s/ckpt is "
           "what is kept", err, rescue, err2, dp_out_dir(dp));
    return DP_ERR;
}

int gpt2_main(int argc, char **argv) {
    char err[1024];
    TrainOptions o;
    train_options_defaults(&o);
    if (train_options_parse_args(&o, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "deadpool train: %s\n", err);
        return 1;
    }
    dp_t *dp = dp_init(NULL, err, sizeof err);
    /* dp_finish(NULL) tells a bad job from a control plane that stayed away (then the
     * process is replaced, the job goes on). */
    if (!dp) { fprintf(stderr, "deadpool train: %s\n", err); return dp_finish(NULL, DP_ERR); }
    Trainer *t = NULL;
    if (train_options_validate(&o, (int)dp_steps(dp), dp_world(dp), err, sizeof err) == 0) t = trainer_create(&o, dp, err, sizeof err);
    if (!t) {
        dp_log(dp, "%s", err);
        return dp_finish(dp, DP_ERR);
    }
    dp_callbacks cb = trainer_callbacks(t);
    dp_status st = dp_join(dp, &cb, err, sizeof err);
    while (st == DP_OK) {
        st = trainer_train(t);
        if (st == DP_OK) st = trainer_gather_model(t);
        if (st != DP_FAILED) break;
        st = dp_recover(dp, err, sizeof err);
    }
    /* Every rank holds the whole model after the last step: the first rank of each machine
     * writes it to that machine's --out (a multi-node job has no shared filesystem). */
    int local = st == DP_OK ? dp_local_rank(dp) : -1;
    if (local == 0) st = save_final_model(t, dp);
    if (st == DP_OK && local < 0)
        dp_log(dp, "cannot tell whether this rank writes the model on its machine (the control plane did not answer "
               "within --control-wait): %s may have no model.bin; rank 0's machine has one", dp_out_dir(dp));
    int rc = dp_finish(dp, st);
    trainer_free(t);
    return rc;
}
