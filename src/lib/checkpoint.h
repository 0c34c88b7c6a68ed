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
 * write its files (app may be NULL), then DONE; removes older checkpoints beyond the newest two. */
int checkpoint_finish(const char *dir, int64_t step, int world, const char *config_text, checkpoint_app_fn app,
                      void *arg, char *err, size_t errlen);
/* Newest complete checkpoint step in DIR, -1 if none (err says why when a problem was found). */
int64_t checkpoint_latest(const char *dir, char *err, size_t errlen);
/* Reads and verifies rank's state file of `step`; *payload is malloc'ed. */
int checkpoint_read_shard(const char *dir, int64_t step, int rank, SnapHeader *h, void **payload, char *err,
                          size_t errlen);
/* The same from a checkpoint's directory (step < 0: any step). */
int checkpoint_read_state(const char *step_dir, int rank, int64_t step, SnapHeader *h, void **payload, char *err,
                          size_t errlen);
/* Path of a file inside checkpoint `step` ("model.bin", "config.txt", ...). */
void checkpoint_path(char *out, size_t len, const char *dir, int64_t step, const char *file);

#endif
