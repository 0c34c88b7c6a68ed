/* generation.h — the layout of one generation's payload: what the snapshot buffers, the
 * replica holders and the checkpoint state files carry for one rank (after the SnapHeader,
 * which holds job, epoch, rank, world, step, length and the CRC32C of all of this).
 *
 *   GenHead   { magic "DPG1", nregions, extra_len, seed, next_step }       32 bytes
 *   GenEntry  { id, kind, len } x nregions                                 16 bytes each
 *   extra     extra_len bytes (the application's small state: cursor, RNG)
 *   data      the regions' bytes, in table order
 *
 * The library writes and reads it; applications only ever see dp_generation views. */
#ifndef DEADPOOL_GENERATION_H
#define DEADPOOL_GENERATION_H

#include <stddef.h>
#include <stdint.h>

#include "deadpool.h"

#define GEN_MAGIC 0x31475044u /* "DPG1" */
#define GEN_MAX_REGIONS 64

typedef struct {
    uint32_t magic, nregions;
    uint64_t extra_len;
    uint64_t seed;
    int64_t next_step;
} GenHead;

typedef struct {
    uint32_t id, kind;
    uint64_t len;
} GenEntry;

/* Bytes of head + table + extra. */
size_t gen_head_bytes(int nregions, size_t extra_len);
/* Writes head, table and extra into buf (at least gen_head_bytes). */
void gen_head_write(void *buf, uint64_t seed, int64_t next_step, const dp_region *r, int n, const void *extra,
                    size_t extra_len);
/* Checks a payload of len bytes and fills g (regions into `regions`, pointing into payload).
 * *seed and *next_step get the head's. 0, or -1 + err saying what does not add up. */
int gen_parse(const void *payload, size_t len, dp_generation *g, dp_region *regions, int max, uint64_t *seed,
              int64_t *next_step, char *err, size_t errlen);

/* 1 if a payload carries state of its rank's own (extra bytes or a DP_SHARDED region) or is
 * too short to tell, 0 if nothing but DP_IDENTICAL regions (state every rank holds). */
int gen_own_state(const void *payload, size_t len);

/* Which of a rank's two blocks of declared state holds generation gen (-1: the initial state)
 * when a snapshot is taken of every generation k with (k + 1) % every == 0. The generations
 * between two snapshots share a block, and each snapshot's successor starts the other one:
 * block floor(gen / every) & 1. So the update after a snapshot is out of place (the snapshot
 * stays intact in its block until the next one has committed) and the others are in place.
 * With every == 1 this is gen & 1. */
int gen_block(int64_t gen, int every);

#endif
