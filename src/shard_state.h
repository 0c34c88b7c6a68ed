/* shard_state.h — the layout of one rank's non-reconstructible state, as snapshots, replicas
 * and checkpoint files carry it:
 *
 *   ShardMeta | params[shard] | adam_m[shard] | adam_v[shard]      (floats, native order)
 *
 * Everything else a rank needs is a pure function of (config, step): the micro-batches
 * (data position), the learning rate (schedule position) and every random choice (RNG state)
 * are computed from (seed, step, rank), so `step` and `seed` stand for all of them. The full
 * parameter vector is the concatenation of the ranks' params shards. */
#ifndef DEADPOOL_SHARD_STATE_H
#define DEADPOOL_SHARD_STATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t step;        /* 0-based step whose optimizer update this state follows */
    uint64_t seed;       /* data sampling and initialisation seed */
    int64_t next_step;   /* data-loader and LR-schedule position: the step to run next */
    int64_t num_params;  /* unpadded model parameters */
    int64_t shard;       /* floats per rank (padded: world * shard >= num_params) */
    int32_t rank, world;
} ShardMeta;

static inline size_t shard_state_bytes(size_t shard) { return sizeof(ShardMeta) + 3 * shard * sizeof(float); }
/* Offsets of the three float arrays inside a state payload. */
static inline size_t shard_state_params_off(void) { return sizeof(ShardMeta); }
static inline size_t shard_state_m_off(size_t shard) { return sizeof(ShardMeta) + shard * sizeof(float); }
static inline size_t shard_state_v_off(size_t shard) { return sizeof(ShardMeta) + 2 * shard * sizeof(float); }

#endif
