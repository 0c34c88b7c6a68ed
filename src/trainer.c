/* trainer.c — model + data + sharded AdamW state of one rank, and the step that ties them to
 * the collectives. */
#include "trainer.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "data.h"
#include "modelfile.h"
#include "optimizer.h"
#include "shard_state.h"
#include "util.h"

struct Trainer {
    JobConfig cfg;
    int rank, size;
    int B, T;
    GPT2 *model;
    DataSet *data;
    size_t num_params;
    size_t shard;       /* parameters owned per rank: ceil(num_params / size) */
    float *m, *v;       /* AdamW moments of this rank's shard */
    int *inputs, *targets;
    AdamWConfig opt;
    ShardMeta meta;     /* live, updated with every optimizer step */
    Snapshot *snap;
    int (*fence_closed)(void *arg);
    void *fence_arg;
    const _Atomic int *abort_flag;
    void (*mid_step)(void *arg, int step);
    void *mid_step_arg;
};

/* Where the initial parameters come from: a resumed checkpoint, a model file, or a preset. */
static int load_model_config(const JobConfig *cfg, char *model_file, size_t len, GPT2Config *mc, int *from_file,
                             char *err, size_t errlen) {
    *from_file = 1;
    if (cfg->resume_step >= 0) {
        checkpoint_path(model_file, len, cfg->resume, cfg->resume_step, "model.bin");
        return modelfile_read_config(model_file, mc, err, errlen);
    }
    snprintf(model_file, len, "%s", cfg->model);
    *from_file = 0;
    if (gpt2_preset(cfg->model, mc) == 0) return 0;
    if (strchr(cfg->model, '/') == NULL && strchr(cfg->model, '.') == NULL) {
        snprintf(err, errlen, "--model: '%s' is neither a preset (tiny, small, gpt2-124m) nor a file", cfg->model);
        return -1;
    }
    *from_file = 1;
    return modelfile_read_config(cfg->model, mc, err, errlen);
}

int trainer_job_model_config(const JobConfig *cfg, GPT2Config *mc, char *err, size_t errlen) {
    char file[4200];
    int from_file;
    return load_model_config(cfg, file, sizeof file, mc, &from_file, err, errlen);
}

static AdamWConfig optimizer_config(const JobConfig *cfg) {
    AdamWConfig o = adamw_defaults();
    o.lr = cfg->lr;
    o.weight_decay = cfg->weight_decay;
    o.grad_clip = cfg->grad_clip;
    o.warmup_steps = cfg->warmup;
    o.total_steps = cfg->steps;
    o.final_lr_frac = cfg->final_lr_frac;
    return o;
}

/* Restores this rank's shard (parameters, moments, position) from a verified state payload. */
int trainer_restore(Trainer *t, const SnapHeader *h, const void *payload, char *err, size_t errlen) {
    ShardMeta meta;
    if (h->length != shard_state_bytes(t->shard)) {
        snprintf(err, errlen, "rank %d state: %llu bytes, expected %zu for this model and %d workers", t->rank,
                 (unsigned long long)h->length, shard_state_bytes(t->shard), t->size);
        return -1;
    }
    memcpy(&meta, payload, sizeof meta);
    if (meta.rank != t->rank || meta.world != t->size || (size_t)meta.num_params != t->num_params ||
        (size_t)meta.shard != t->shard || meta.seed != t->cfg.seed) {
        snprintf(err, errlen, "rank %d state: taken by rank %d of %d with seed %llu, this job is rank %d of %d with seed %llu",
                 t->rank, meta.rank, meta.world, (unsigned long long)meta.seed, t->rank, t->size,
                 (unsigned long long)t->cfg.seed);
        return -1;
    }
    const char *p = payload;
    float *params = gpt2_params(t->model) + (size_t)t->rank * t->shard;
    memcpy(params, p + shard_state_params_off(), t->shard * sizeof(float));
    memcpy(t->m, p + shard_state_m_off(t->shard), t->shard * sizeof(float));
    memcpy(t->v, p + shard_state_v_off(t->shard), t->shard * sizeof(float));
    t->meta = meta;
    return 0;
}

static int resume_shard(Trainer *t, char *err, size_t errlen) {
    SnapHeader h;
    void *payload;
    if (checkpoint_read_shard(t->cfg.resume, t->cfg.resume_step, t->rank, &h, &payload, err, errlen) != 0) return -1;
    int rc = trainer_restore(t, &h, payload, err, errlen);
    free(payload);
    return rc;
}

Trainer *trainer_create(const JobConfig *cfg, int rank, int size, char *err, size_t errlen) {
    GPT2Config mc;
    int from_file;
    char model_file[4200];
    if (load_model_config(cfg, model_file, sizeof model_file, &mc, &from_file, err, errlen) != 0) return NULL;
    int T = cfg->seq_len ? cfg->seq_len : mc.max_seq_len;
    if (T > mc.max_seq_len) {
        snprintf(err, errlen, "--seq-len: expected <= the model's max_seq_len %d, found %d", mc.max_seq_len, T);
        return NULL;
    }
    Trainer *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return NULL; }
    t->cfg = *cfg;
    t->rank = rank;
    t->size = size;
    t->B = cfg->batch;
    t->T = T;
    t->opt = optimizer_config(cfg);
    t->num_params = gpt2_num_params(&mc);
    t->shard = (t->num_params + (size_t)size - 1) / (size_t)size;

    t->data = cfg->data[0] ? data_open(cfg->data, mc.vocab_size, err, errlen) : data_builtin(1 << 20);
    if (!t->data) goto fail;
    if (data_num_tokens(t->data) <= (size_t)T) {
        snprintf(err, errlen, "%s: %zu tokens, need more than seq_len %d", cfg->data, data_num_tokens(t->data), T);
        goto fail;
    }
    t->model = gpt2_create(&mc, t->B, T, t->shard * (size_t)size);
    /* Zeroed by memset, not left to the kernel: every page is touched now, so restoring a
     * shard into a warm spare does not pay for page faults during recovery. */
    t->m = alloc_huge(t->shard * sizeof(float));
    t->v = alloc_huge(t->shard * sizeof(float));
    if (t->m) memset(t->m, 0, t->shard * sizeof(float));
    if (t->v) memset(t->v, 0, t->shard * sizeof(float));
    t->inputs = malloc((size_t)t->B * T * sizeof(int));
    t->targets = malloc((size_t)t->B * T * sizeof(int));
    if (!t->model || !t->m || !t->v || !t->inputs || !t->targets) {
        snprintf(err, errlen, "out of memory allocating the model (%zu parameters, batch %d x %d)",
                 t->num_params, t->B, T);
        goto fail;
    }
    if (from_file) {
        if (modelfile_read(model_file, &mc, gpt2_params(t->model), err, errlen) != 0) goto fail;
    } else {
        gpt2_init_params(t->model, cfg->seed);
    }
    t->meta = (ShardMeta){.step = -1, .seed = cfg->seed, .next_step = 0, .num_params = (int64_t)t->num_params,
                          .shard = (int64_t)t->shard, .rank = rank, .world = size};
    if (cfg->resume_step >= 0 && resume_shard(t, err, errlen) != 0) goto fail;
    openblas_set_num_threads(cfg->threads);
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(Trainer *t) {
    if (!t) return;
    gpt2_free(t->model);
    data_free(t->data);
    free(t->m);
    free(t->v);
    free(t->inputs);
    free(t->targets);
    free(t);
}

int trainer_first_step(const Trainer *t) { return (int)t->meta.next_step; }

void trainer_set_rank(Trainer *t, int rank) {
    t->rank = rank;
    t->meta.rank = rank;
}

void trainer_reinit(Trainer *t) {
    gpt2_init_params(t->model, t->cfg.seed);
    memset(t->m, 0, t->shard * sizeof(float));
    memset(t->v, 0, t->shard * sizeof(float));
    t->meta.step = -1;
    t->meta.next_step = 0;
}

comm_status trainer_sync_params(Trainer *t, comm_t *comm) {
    float *params = gpt2_params(t->model);
    return comm_allgather(comm, params + (size_t)t->rank * t->shard, params, t->shard, job_comm_timeout_ms(&t->cfg));
}

int trainer_state_regions(Trainer *t, SnapRegion regions[4]) {
    size_t bytes = t->shard * sizeof(float);
    regions[0] = (SnapRegion){&t->meta, sizeof t->meta};
    regions[1] = (SnapRegion){gpt2_params(t->model) + (size_t)t->rank * t->shard, bytes};
    regions[2] = (SnapRegion){t->m, bytes};
    regions[3] = (SnapRegion){t->v, bytes};
    return 4;
}

void trainer_attach_snapshot(Trainer *t, Snapshot *snap) { t->snap = snap; }

void trainer_set_mid_step_hook(Trainer *t, void (*hook)(void *arg, int step), void *arg) {
    t->mid_step = hook;
    t->mid_step_arg = arg;
}

void trainer_set_abort_flag(Trainer *t, const _Atomic int *flag) {
    t->abort_flag = flag;
    gpt2_set_abort_flag(t->model, flag);
}

void trainer_set_fence_check(Trainer *t, int (*closed)(void *arg), void *arg) {
    t->fence_closed = closed;
    t->fence_arg = arg;
}

const GPT2Config *trainer_model_config(const Trainer *t) { return gpt2_config(t->model); }
size_t trainer_num_params(const Trainer *t) { return t->num_params; }
const char *trainer_data_description(const Trainer *t) { return data_describe(t->data); }

/* Forward + backward over this rank's micro-batches; returns the sum of their mean losses. */
static float accumulate_gradients(Trainer *t, int step) {
    int A = t->cfg.grad_accum;
    float loss_sum = 0.0f;
    gpt2_zero_grad(t->model);
    for (int a = 0; a < A; a++) {
        data_batch(t->data, t->cfg.seed, step, t->rank * A + a, t->B, t->T, t->inputs, t->targets);
        loss_sum += gpt2_forward(t->model, t->inputs, t->targets, t->B, t->T);
        if (t->abort_flag && atomic_load(t->abort_flag)) break;
        gpt2_backward(t->model, 1.0f);
    }
    return loss_sum;
}

train_status trainer_step(Trainer *t, comm_t *comm, int step, StepStats *stats) {
    double t0 = now_ms();
    int timeout = job_comm_timeout_ms(&t->cfg);
    float *params = gpt2_params(t->model), *grads = gpt2_grads(t->model);
    size_t padded = t->shard * (size_t)t->size;

    float loss = accumulate_gradients(t, step);
    if (t->mid_step) t->mid_step(t->mid_step_arg, step);
    if (t->abort_flag && atomic_load(t->abort_flag)) return TRAIN_FENCED;
    /* No rank reduces step k+1 before its generation k is committed (see snapshot.h). */
    double waited = 0.0;
    if (t->snap && snapshot_wait_previous(t->snap, &waited) != 0) return TRAIN_SNAPSHOT;
    comm_status st = comm_allreduce_sum(comm, grads, padded, timeout);
    if (st == COMM_OK) st = comm_allreduce_sum(comm, &loss, 1, timeout);
    if (st != COMM_OK) return TRAIN_COMM;
    if (t->fence_closed && t->fence_closed(t->fence_arg)) return TRAIN_FENCED;

    /* Gradients are now sums over N*A micro-batch means: average them. */
    int micro_batches = t->size * t->cfg.grad_accum;
    float avg = 1.0f / (float)micro_batches;
    double norm = grad_global_norm(grads, t->num_params) * avg;
    float lr = adamw_lr(&t->opt, step);
    size_t off = (size_t)t->rank * t->shard;
    adamw_update(params + off, grads + off, t->m, t->v, t->shard, &t->opt, lr,
                 avg * grad_clip_scale(&t->opt, norm), step + 1);
    t->meta.step = step;
    t->meta.next_step = step + 1;
    st = comm_allgather(comm, params + off, params, t->shard, timeout);
    if (st != COMM_OK) return TRAIN_COMM;
    if (t->snap && (step + 1) % t->cfg.snapshot_every == 0) snapshot_capture(t->snap, step);

    stats->step = step;
    stats->loss = loss / (float)micro_batches;
    stats->lr = lr;
    stats->grad_norm = (float)norm;
    stats->snapshot_wait_ms = waited;
    stats->step_ms = now_ms() - t0;
    stats->tokens_per_s = (double)micro_batches * t->B * t->T / (stats->step_ms / 1e3);
    return TRAIN_OK;
}

int trainer_save_model(const Trainer *t, const char *path, char *err, size_t errlen) {
    return modelfile_write(path, gpt2_config(t->model), gpt2_params(t->model), err, errlen);
}
