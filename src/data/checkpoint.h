/* checkpoint.h — the persistent tier: checkpoints on disk that `deadpool run --resume` reads.
 *
 * DIR/ckpt/step_NNNNNNNNN/ (N = steps completed) holds one state file per rank
 * (rank_RRRRR.state: SnapHeader + generation payload, generation.h; CRC32C checked on read),
 * the job config (config.txt), the application's own files (the GPT-2 trainer writes the
 * model there), and DONE, written last: a checkpoint without DONE is incomplete and ignored. Every file is written atomically (temp + rename).
 * The two newest complete checkpoints are kept. */
#ifndef DEADPOOL_CHECKPOINT_H
#define DEADPOOL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "replica.h"
#include "snapshot.h"

/* Writes rank h->rank's state file for step h->step from the given regions (the payload). */
int checkpoint_write_shard(const char *dir, const SnapHeader *h, const SnapRegion *regions, int nregions,
                           char *err, size_t errlen);
/* Writes a state file straight from live regions (the synchronous --ft disk path): builds
 * the header and checksum itself. */
int checkpoint_write_live(const char *dir, const char *job, int64_t epoch, int rank, int world, int64_t step,
                          const SnapRegion *regions, int nregions, char *err, size_t errlen);
/* The application's part of a checkpoint (deadpool.h's checkpoint callback). */
typedef int (*checkpoint_app_fn)(void *arg, const char *step_dir, int64_t step, int world, char *err, size_t errlen);
/* Once every rank's state file for `step` exists: writes config.txt, lets the application
 * write its files (app may be NULL), writes MANIFEST (CRC32C of every file), then DONE;
 * removes older checkpoints beyond the newest two, except step `pinned` (-1: none). On any
 * failure the step's directory is removed: a checkpoint is there whole or not at all.
 * pinned: the checkpoint the running job resumed from. A process that starts during the job
 * (a spare, late) reads its initial model there (dp_resume_dir), so rotation must not take it
 * while the job runs; the next run's rotation does. */
int checkpoint_finish(const char *dir, int64_t step, int world, const char *config_text, checkpoint_app_fn app,
                      void *arg, int64_t pinned, char *err, size_t errlen);
/* Newest complete checkpoint step in DIR (DONE present; nothing read), -1 if none (err says
 * why when a problem was found). _below: the newest one before step `below`. */
int64_t checkpoint_latest(const char *dir, char *err, size_t errlen);
int64_t checkpoint_latest_below(const char *dir, int64_t below, char *err, size_t errlen);
/* Verifies every file of checkpoint `step` against its MANIFEST (CRC32C and size, every rank's
 * state present). 0 / -1 + err naming the file. */
int checkpoint_verify(const char *dir, int64_t step, char *err, size_t errlen);
/* The newest checkpoint that verifies, falling back to older ones (logging which one was
 * damaged and why). -1 + err when none does. What --resume and the --ft disk restart use. */
int64_t checkpoint_latest_intact(const char *dir, char *err, size_t errlen);
/* Reads and verifies rank's state file of `step`; *payload is malloc'ed. */
int checkpoint_read_shard(const char *dir, int64_t step, int rank, SnapHeader *h, void **payload, char *err,
                          size_t errlen);
/* The same from a checkpoint's directory (step < 0: any step). */
int checkpoint_read_state(const char *step_dir, int rank, int64_t step, SnapHeader *h, void **payload, char *err,
                          size_t errlen);
/* --- machines without a shared filesystem (multi-node jobs) -----------------------------
 * Every machine keeps the state files of the ranks it ran, beside the job's config.txt; a
 * checkpoint is complete when every rank's state is on some machine's disk, which only the
 * machines together can tell (`deadpool run --resume` gathers their inventories; decide.h's
 * resume_choose picks the step).
 * checkpoint_inventory: for each step directory in DIR, newest first, the ranks whose state
 * file verifies, as protocol.h's inventory text ("STEP:R,R,...;STEP:...", 0-based steps,
 * inventory_format); 0, or -1 when it does not fit. */
int checkpoint_inventory(const char *dir, char *out, size_t len);
/* Writes config.txt of `step` unless present (atomic). 0 / -1 + err. */
int checkpoint_write_config(const char *dir, int64_t step, const char *text, char *err, size_t errlen);
/* Newest step directory holding a config.txt, complete or not; -1 + err if none. */
int64_t checkpoint_latest_config(const char *dir, char *err, size_t errlen);
/* Removes the step directories older than `step` (the newest one known complete across the
 * machines: what is newer may still be completing, what is older is not needed any more),
 * except step `pinned` (as for checkpoint_finish). */
void checkpoint_prune_below(const char *dir, int64_t step, int64_t pinned);

/* Path of a file inside checkpoint `step` ("model.bin", "config.txt", ...). */
void checkpoint_path(char *out, size_t len, const char *dir, int64_t step, const char *file);

#endif
