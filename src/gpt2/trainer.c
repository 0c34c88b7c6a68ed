/* trainer.c — model + data + sharded AdamW state of one rank, the step that ties them to
 * DeadPool's collectives, and the callbacks through which DeadPool snapshots, restores and
 * checkpoints it. */
#include "trainer.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "modelfile.h"
#include "optimizer.h"
#include "util.h"

/* Region ids of the state DeadPool keeps for us. */
enum { REGION_PARAMS = 1, REGION_M = 2, REGION_V = 3 };

struct Trainer {
    TrainOptions opt_cfg;
    dp_t *dp;
    int size;           /* data-parallel ranks */
    int B, T;
    uint64_t seed;
    GPT2 *model;
    GPT2Config mc;
    DataSet *data;
    size_t num_params;
    size_t shard;       /* parameters owned per rank: ceil(num_params / size) */
    /* This rank's shard of the parameters and its AdamW moments live in DeadPool's buffers
     * (dp_state: one per generation parity): the update reads one and writes the other. */
    int *inputs, *targets;
    AdamWConfig opt;
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

/* Generation -1: this rank's shard of the initial parameters, zero moments (a spare, whose
 * rank is not known yet, gets shard 0: it restores before it trains). */
static void initial_state(Trainer *t) {
    size_t bytes = t->shard * sizeof(float);
    int rank = dp_rank(t->dp) > 0 ? dp_rank(t->dp) : 0;
    memcpy(dp_state(t->dp, REGION_PARAMS, -1), gpt2_params(t->model) + (size_t)rank * t->shard, bytes);
    memset(dp_state(t->dp, REGION_M, -1), 0, bytes);
    memset(dp_state(t->dp, REGION_V, -1), 0, bytes);
}

Trainer *trainer_create(const TrainOptions *o, dp_t *dp, char *err, size_t errlen) {
    GPT2Config mc;
    int from_file;
    char model_file[4200];
    if (load_model_config(o, dp_resume_dir(dp), model_file, sizeof model_file, &mc, &from_file, err, errlen) != 0)
        return NULL;
    int T = o->seq_len ? o->seq_len : mc.max_seq_len;
    if (T > mc.max_seq_len) {
        snprintf(err, errlen, "--seq-len: expected <= the model's max_seq_len %d, found %d", mc.max_seq_len, T);
        return NULL;
    }
    Trainer *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return NULL; }
    t->opt_cfg = *o;
    t->dp = dp;
    t->size = dp_world(dp);
    t->seed = dp_seed(dp);
    t->B = o->batch;
    t->T = T;
    t->mc = mc;
    t->opt = optimizer_config(o, (int)dp_steps(dp));
    t->num_params = gpt2_num_params(&mc);
    t->shard = (t->num_params + (size_t)t->size - 1) / (size_t)t->size;

    t->data = o->data[0] ? data_open(o->data, mc.vocab_size, err, errlen) : data_builtin(1 << 20);
    if (!t->data) goto fail;
    if (data_num_tokens(t->data) <= (size_t)T) {
        snprintf(err, errlen, "%s: %zu tokens, need more than seq_len %d", o->data, data_num_tokens(t->data), T);
        goto fail;
    }
    t->model = gpt2_create(&mc, t->B, T, t->shard * (size_t)t->size);
    size_t bytes = t->shard * sizeof(float);
    dp_state_spec state[3] = {{REGION_PARAMS, bytes}, {REGION_M, bytes}, {REGION_V, bytes}};
    if (dp_state_declare(dp, state, 3, err, errlen) != DP_OK) goto fail;
    t->inputs = malloc((size_t)t->B * T * sizeof(int));
    t->targets = malloc((size_t)t->B * T * sizeof(int));
    if (!t->model || !t->inputs || !t->targets) {
        snprintf(err, errlen, "out of memory allocating the model (%zu parameters, batch %d x %d)", t->num_params, t->B, T);
        goto fail;
    }
    if (from_file) {
        if (modelfile_read(model_file, &mc, gpt2_params(t->model), err, errlen) != 0) goto fail;
    } else {
        gpt2_init_params(t->model, t->seed);
    }
    initial_state(t);
    gpt2_set_abort_check(t->model, aborted, dp);
    openblas_set_num_threads(o->threads);
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(Trainer *t) {
    if (!t) return;
    gpt2_free(t->model);
    data_free(t->data);
    free(t->inputs);
    free(t->targets);
    free(t);
}

/* --- DeadPool callbacks --------------------------------------------------------------- */

/* All of the state is declared (dp_state): nothing else to report. */
static int regions_cb(void *arg, dp_region *out, int max) {
    (void)arg, (void)out, (void)max;
    return 0;
}

static void reset_cb(void *arg) {
    Trainer *t = arg;
    gpt2_init_params(t->model, t->seed);
    initial_state(t);
}

/* Every rank restored its own shard: the full parameters are their concatenation. */
static dp_status rebuild_cb(dp_t *dp, void *arg) {
    Trainer *t = arg;
    const float *shard = dp_state(dp, REGION_PARAMS, dp_next_step(dp) - 1);
    return dp_allgather(dp, shard, gpt2_params(t->model), t->shard);
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

/* A checkpoint's model.bin: the concatenation of every rank's parameter shard. Reads only the
 * state files and the immutable model shape (this may run on DeadPool's snapshot thread). */
static int checkpoint_cb(void *arg, const char *dir, int64_t step, int world, char *err, size_t errlen) {
    Trainer *t = arg;
    (void)step;
    float *params = malloc(t->shard * (size_t)world * sizeof(float));
    if (!params) { snprintf(err, errlen, "out of memory for the checkpoint's model"); return -1; }
    int rc = 0;
    for (int r = 0; r < world && rc == 0; r++) {
        ShardCopy c = {params, t->shard, r};
        rc = dp_checkpoint_read(dir, r, copy_params_shard, &c, err, errlen);
        if (rc != 0 && !err[0]) snprintf(err, errlen, "%s: rank %d's state has no parameter shard of %zu floats", dir, r, t->shard);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (rc == 0) rc = modelfile_write(path, &t->mc, params, err, errlen);
    free(params);
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

static dp_status trainer_step(Trainer *t, int step) {
    dp_t *dp = t->dp;
    int rank = dp_rank(dp);
    float *params = gpt2_params(t->model), *grads = gpt2_grads(t->model);
    size_t padded = t->shard * (size_t)t->size;

    float loss = accumulate_gradients(t, rank, step);
    dp_status st = dp_step_before_reduce(dp, step);
    if (st == DP_OK) st = dp_allreduce_sum(dp, grads, padded);
    if (st == DP_OK) st = dp_allreduce_sum(dp, &loss, 1);
    if (st == DP_OK) st = dp_step_before_update(dp);
    if (st != DP_OK) return st;

    /* Gradients are now sums over N*A micro-batch means: average them. */
    int micro_batches = t->size * t->opt_cfg.grad_accum;
    float avg = 1.0f / (float)micro_batches;
    double norm = grad_global_norm(grads, t->num_params) * avg;
    float lr = adamw_lr(&t->opt, step);
    size_t off = (size_t)rank * t->shard;
    /* Out of place: generation step - 1 in, generation step out, into DeadPool's other buffer. */
    float *p_out = dp_state(dp, REGION_PARAMS, step);
    adamw_update(p_out, dp_state(dp, REGION_PARAMS, step - 1), grads + off, dp_state(dp, REGION_M, step),
                 dp_state(dp, REGION_M, step - 1), dp_state(dp, REGION_V, step), dp_state(dp, REGION_V, step - 1),
                 t->shard, &t->opt, lr, avg * grad_clip_scale(&t->opt, norm), step + 1);
    st = dp_allgather(dp, p_out, params, t->shard);
    if (st != DP_OK) return st;
    dp_metrics m = {.loss = loss / (float)micro_batches, .lr = lr, .grad_norm = norm,
                    .tokens = (double)micro_batches * t->B * t->T};
    return dp_step_commit(dp, step, NULL, 0, &m);
}

dp_status trainer_train(Trainer *t) {
    for (int64_t step = dp_next_step(t->dp); step < dp_steps(t->dp); step++) {
        dp_status st = trainer_step(t, (int)step);
        if (st != DP_OK) return st;
    }
    return DP_OK;
}

int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen) {
    return modelfile_write(path, gpt2_config(t->model), gpt2_params(t->model), err, errlen);
}

/* --- the program ---------------------------------------------------------------------- */

/* The trained model goes to OUT/model.bin; if that fails (a full disk, say), to the temporary
 * directory, saying where: the work is not lost for want of room in --out. */
static dp_status save_final_model(Trainer *t, dp_t *dp) {
    char path[1200], err[1024], err2[1024];
    snprintf(path, sizeof path, "%s/model.bin", dp_out_dir(dp));
    if (trainer_save_model(t, path, err, sizeof err) == 0) {
        dp_output_saved(dp, path);
        return DP_OK;
    }
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char rescue[1200];
    snprintf(rescue, sizeof rescue, "%s/deadpool-model-%d.bin", tmp, (int)getpid());
    if (trainer_save_model(t, rescue, err2, sizeof err2) == 0) {
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
    if (!dp) { fprintf(stderr, "deadpool train: %s\n", err); return 1; }
    Trainer *t = NULL;
    if (train_options_validate(&o, (int)dp_steps(dp), err, sizeof err) == 0) t = trainer_create(&o, dp, err, sizeof err);
    if (!t) {
        dp_log(dp, "%s", err);
        return dp_finish(dp, DP_ERR);
    }
    dp_callbacks cb = trainer_callbacks(t);
    dp_status st = dp_join(dp, &cb, err, sizeof err);
    while (st == DP_OK) {
        st = trainer_train(t);
        if (st != DP_FAILED) break;
        st = dp_recover(dp, err, sizeof err);
    }
    /* Every rank holds the whole model after the last step: the first rank of each machine
     * writes it to that machine's --out (a multi-node job has no shared filesystem). */
    if (st == DP_OK && dp_local_rank(dp) == 0) st = save_final_model(t, dp);
    int rc = dp_finish(dp, st);
    trainer_free(t);
    return rc;
}
