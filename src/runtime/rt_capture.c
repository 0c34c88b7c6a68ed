/* rt_capture.c — generations out of the application's memory into DeadPool's snapshots: the
 * state DeadPool owns (dp_state_declare) and the regions a capture takes (zero-copy where the
 * declared state lies). The way back is rt_restore.c. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"

#include "util.h"

/* --- state DeadPool owns ---------------------------------------------------------------
 * dp_state(id, k) is generation k of a declared region, in block[gen_block(k, every)] (every:
 * --snapshot-every; without in-memory snapshots, never: every update but the first is in
 * place, as in a loop without DeadPool). A snapshot generation k ((k + 1) % every == 0) is
 * snapshotted where it lies (no copy: capture_zero_copy); the update of step k + 1 reads it
 * and writes the other block, and the updates up to the next snapshot k + every write that
 * other block in place. Why block[gen_block(k)] stays intact as long as a rollback may need k:
 * the next write to it is the update of step k + every + 1, which comes after this rank's
 * gradient reduction of that step; every rank enters that reduction only after committing
 * snapshot k + every (dp_step_before_reduce waits for it), so by then the newest generation
 * every rank committed is k + every or later, and it is in the other block (docs/DESIGN.md,
 * zero-copy state). */

dp_status dp_state_declare(dp_t *dp, const dp_state_spec *specs, int n, char *err, size_t errlen) {
    if (dp->joined || dp->nstate) {
        snprintf(err, errlen, "dp_state_declare: call it once, before dp_join");
        return DP_ERR;
    }
    if (n <= 0 || n > GEN_MAX_REGIONS) {
        snprintf(err, errlen, "dp_state_declare: expected 1..%d regions, found %d", GEN_MAX_REGIONS, n);
        return DP_ERR;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (specs[j].id == specs[i].id) {
                snprintf(err, errlen, "dp_state_declare: region id %u declared twice", specs[i].id);
                return DP_ERR;
            }
        dp->state[i] = specs[i];
        dp->state_off[i] = off;
        off += specs[i].len;
    }
    /* Room for the largest head a generation of these regions can have (64 KiB of extra). */
    dp->head_area = (gen_head_bytes(n, DP_STATE_EXTRA_MAX) + 63) & ~(size_t)63;
    dp->block_bytes = dp->head_area + off;
    for (int b = 0; b < 2; b++) {
        dp->block[b] = alloc_huge(dp->block_bytes);
        if (!dp->block[b]) {
            snprintf(err, errlen, "dp_state_declare: out of memory for 2 x %zu bytes", dp->block_bytes);
            return DP_ERR;
        }
        prefault(dp->block[b], dp->block_bytes); /* a spare restores into them: no faults then */
    }
    dp->nstate = n;
    return DP_OK;
}

static int state_every(const dp_t *dp) { return dp->cfg.ft == FT_DEADPOOL ? dp->cfg.snapshot_every : INT_MAX; }

/* The block that holds generation gen of the declared state. */
unsigned char *rt_block_of(const dp_t *dp, int64_t gen) { return dp->block[gen_block(gen, state_every(dp))]; }

int rt_state_index(const dp_t *dp, uint32_t id) {
    for (int i = 0; i < dp->nstate; i++)
        if (dp->state[i].id == id) return i;
    return -1;
}

/* Generation gen of the k-th declared region. */
unsigned char *rt_state_at(const dp_t *dp, int k, int64_t gen) {
    return rt_block_of(dp, gen) + dp->head_area + dp->state_off[k];
}

void *dp_state(const dp_t *dp, uint32_t id, int64_t gen) {
    int k = rt_state_index(dp, id);
    return k < 0 ? NULL : rt_state_at(dp, k, gen);
}

/* The declared regions of generation gen into out (dp->nstate of them). */
static void declared_regions(const dp_t *dp, int64_t gen, dp_region *out) {
    for (int k = 0; k < dp->nstate; k++)
        out[k] = (dp_region){dp->state[k].id, DP_SHARDED, rt_state_at(dp, k, gen), dp->state[k].len};
}

/* The application's regions now, then the declared state of generation gen. -1 + dp->err. */
int rt_app_regions(dp_t *dp, int64_t gen, dp_region *out, int max) {
    int n = dp->cb.regions(dp->cb.arg, out, max);
    if (n < 0 || n > max) {
        snprintf(dp->err, sizeof dp->err, "the regions callback reported %d regions, expected 0..%d", n, max);
        return -1;
    }
    if (n + dp->nstate > max) {
        snprintf(dp->err, sizeof dp->err, "%d regions and %d declared: more than %d", n, dp->nstate, max);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (rt_state_index(dp, out[i].id) >= 0) {
            snprintf(dp->err, sizeof dp->err, "region %u is both declared (dp_state_declare) and reported", out[i].id);
            return -1;
        }
    declared_regions(dp, gen, out + n);
    return n + dp->nstate;
}

/* The local part of generation `step` (see struct dp): same[0..n), all DP_IDENTICAL, as a
 * generation payload of its own in dp->snap_locals; nothing when n is 0. 0, -1 + dp->err. */
static int local_part(dp_t *dp, int64_t step, const dp_region *same, int n) {
    dp->nlocals = 0;
    if (n == 0) return 0;
    size_t hb = gen_head_bytes(n, 0);
    if (hb > dp->local_head_cap) {
        unsigned char *grown = realloc(dp->local_head, hb);
        if (!grown) { snprintf(dp->err, sizeof dp->err, "out of memory for a generation head"); return -1; }
        dp->local_head = grown;
        dp->local_head_cap = hb;
    }
    gen_head_write(dp->local_head, dp->cfg.seed, step + 1, same, n, NULL, 0);
    dp->snap_locals[0] = (SnapRegion){dp->local_head, hb};
    for (int i = 0; i < n; i++) dp->snap_locals[i + 1] = (SnapRegion){same[i].ptr, same[i].len};
    dp->nlocals = n + 1;
    return 0;
}

/* Generation `step` as one payload where it lies, when it is a snapshot generation (the
 * next update writes the other block: gen_block) and all of this rank's state is declared:
 * the head goes right before the regions in its block and the snapshot thread replicates from
 * there. 1 captured, 0 not possible (copy as usual; e.g. a restore point from a checkpoint
 * between two snapshots, whose successor is updated in place). */
int rt_capture_zero_copy(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    if (!dp->nstate || rt_block_of(dp, step) == rt_block_of(dp, step + 1) || extra_len > DP_STATE_EXTRA_MAX) return 0;
    dp_region now[GEN_MAX_REGIONS];
    int n = dp->cb.regions(dp->cb.arg, now, GEN_MAX_REGIONS);
    if (n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (now[i].kind == DP_SHARDED || dp->rank == 0) return 0; /* state of its own to copy */
    if (local_part(dp, step, now, n) != 0) return 0; /* the identical regions, kept here only */
    dp_region kept[GEN_MAX_REGIONS];
    declared_regions(dp, step, kept);
    size_t hb = gen_head_bytes(dp->nstate, extra_len);
    unsigned char *payload = rt_block_of(dp, step) + dp->head_area - hb;
    gen_head_write(payload, dp->cfg.seed, step + 1, kept, dp->nstate, extra, extra_len);
    return snapshot_capture_external(dp->snap, step, payload, hb + dp->block_bytes - dp->head_area, dp->snap_locals,
                                     dp->nlocals) == 0;
}

/* The application's regions now, with the snapshot regions of this rank's generation: the
 * head first, then the regions it replicates: its own, and on rank 0 the identical ones too
 * (so that they outlive every member failing at once). Every other rank keeps the identical
 * regions in the local part (local_part): any survivor can provide them after a rollback.
 * The number of snapshot regions, -1 + dp->err. */
int rt_gather_regions(dp_t *dp, int64_t step, const void *extra, size_t extra_len) {
    int n = rt_app_regions(dp, step, dp->app_regions, GEN_MAX_REGIONS);
    if (n < 0) return -1;
    dp_region kept[GEN_MAX_REGIONS], same[GEN_MAX_REGIONS];
    int k = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (dp->app_regions[i].kind == DP_SHARDED || dp->rank == 0) kept[k++] = dp->app_regions[i];
        else same[m++] = dp->app_regions[i];
    }
    if (local_part(dp, step, same, m) != 0) return -1;
    size_t hb = gen_head_bytes(k, extra_len);
    if (hb > dp->head_cap) {
        unsigned char *grown = realloc(dp->head, hb);
        if (!grown) { snprintf(dp->err, sizeof dp->err, "out of memory for a generation head"); return -1; }
        dp->head = grown;
        dp->head_cap = hb;
    }
    gen_head_write(dp->head, dp->cfg.seed, step + 1, kept, k, extra, extra_len);
    dp->snap_regions[0] = (SnapRegion){dp->head, hb};
    for (int i = 0; i < k; i++) dp->snap_regions[i + 1] = (SnapRegion){kept[i].ptr, kept[i].len};
    return k + 1;
}
