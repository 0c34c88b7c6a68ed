/* checkpoint.c — writes, completes, finds and reads checkpoints of the persistent tier. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "checksum.h"
#include "util.h"

#define KEEP_CHECKPOINTS 2

/* Directories are named by steps completed (1-based), as users count them; `step` here is the
 * 0-based index of the last step, as everywhere inside. */
static void step_dir(char *out, size_t len, const char *dir, int64_t step) {
    snprintf(out, len, "%s/ckpt/step_%09" PRId64, dir, step + 1);
}

void checkpoint_path(char *out, size_t len, const char *dir, int64_t step, const char *file) {
    char d[4096];
    step_dir(d, sizeof d, dir, step);
    snprintf(out, len, "%s/%s", d, file);
}

static void shard_path(char *out, size_t len, const char *dir, int64_t step, int rank) {
    char name[64];
    snprintf(name, sizeof name, "rank_%05d.state", rank);
    checkpoint_path(out, len, dir, step, name);
}

int checkpoint_write_shard(const char *dir, const SnapHeader *h, const SnapRegion *regions, int nregions,
                           char *err, size_t errlen) {
    char d[4096], path[4200];
    step_dir(d, sizeof d, dir, h->step);
    if (mkdir_p(d) != 0) { snprintf(err, errlen, "%s: cannot create: %s", d, strerror(errno)); return -1; }
    shard_path(path, sizeof path, dir, h->step, h->rank);
    struct iovec parts[9];
    if (nregions > 8) { snprintf(err, errlen, "too many state regions"); return -1; }
    parts[0] = (struct iovec){(void *)h, sizeof *h};
    for (int i = 0; i < nregions; i++) parts[i + 1] = (struct iovec){(void *)regions[i].ptr, regions[i].len};
    return write_file_atomic(path, parts, nregions + 1, err, errlen);
}

int checkpoint_write_live(const char *dir, const char *job, int64_t epoch, int rank, int world, int64_t step,
                          const SnapRegion *regions, int nregions, char *err, size_t errlen) {
    SnapHeader h;
    memset(&h, 0, sizeof h);
    h.magic = SNAP_MAGIC;
    h.version = SNAP_VERSION;
    snprintf(h.job, sizeof h.job, "%s", job);
    h.epoch = epoch;
    h.rank = rank;
    h.world = world;
    h.step = step;
    for (int i = 0; i < nregions; i++) {
        h.crc = crc32c(h.crc, regions[i].ptr, regions[i].len);
        h.length += regions[i].len;
    }
    snap_header_seal(&h);
    return checkpoint_write_shard(dir, &h, regions, nregions, err, errlen);
}

int checkpoint_read_shard(const char *dir, int64_t step, int rank, SnapHeader *h, void **payload, char *err,
                          size_t errlen) {
    char d[4096];
    step_dir(d, sizeof d, dir, step);
    return checkpoint_read_state(d, rank, step, h, payload, err, errlen);
}

int checkpoint_read_state(const char *step_dir, int rank, int64_t step, SnapHeader *h, void **payload, char *err,
                          size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rank_%05d.state", step_dir, rank);
    *payload = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    int rc = -1;
    const char *bad;
    if (fread(h, sizeof *h, 1, f) != 1) { snprintf(err, errlen, "%s: state header truncated", path); goto out; }
    if ((bad = snap_header_check(h)) != NULL) { snprintf(err, errlen, "%s: %s", path, bad); goto out; }
    if (h->rank != rank || (step >= 0 && h->step != step)) {
        snprintf(err, errlen, "%s: header says rank %d step %" PRId64 ", expected rank %d step %" PRId64, path, h->rank,
                 h->step, rank, step);
        goto out;
    }
    *payload = malloc(h->length ? h->length : 1);
    if (!*payload) { snprintf(err, errlen, "%s: out of memory (%" PRIu64 " bytes)", path, h->length); goto out; }
    if (fread(*payload, 1, h->length, f) != h->length || fgetc(f) != EOF) {
        snprintf(err, errlen, "%s: state size differs from its header's %" PRIu64 " bytes", path, h->length);
        goto out;
    }
    uint32_t crc = crc32c(0, *payload, h->length);
    if (crc != h->crc) {
        snprintf(err, errlen, "%s: checksum mismatch (CRC32C %08x, header says %08x): corrupt state file", path, crc, h->crc);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    if (rc != 0) { free(*payload); *payload = NULL; }
    return rc;
}

static int parse_step_dir(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    if (*end || v < 1) return -1;
    *step = v - 1;
    return 0;
}

static int is_complete(const char *dir, int64_t step) {
    char path[4200];
    checkpoint_path(path, sizeof path, dir, step, "DONE");
    return access(path, F_OK) == 0;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[4400];
            snprintf(p, sizeof p, "%.4000s/%.255s", path, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Keeps the KEEP_CHECKPOINTS newest complete checkpoints and anything newer than the oldest kept. */
static void prune(const char *dir) {
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    DIR *d = opendir(ck);
    if (!d) return;
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 4096) {
        int64_t s;
        if (parse_step_dir(e->d_name, &s) == 0) steps[n++] = s;
    }
    closedir(d);
    int64_t kept[KEEP_CHECKPOINTS];
    int nkept = 0;
    for (int k = 0; k < KEEP_CHECKPOINTS; k++) {
        int64_t best = -1;
        for (int i = 0; i < n; i++)
            if (is_complete(dir, steps[i]) && steps[i] > best && (nkept == 0 || steps[i] < kept[nkept - 1])) best = steps[i];
        if (best < 0) break;
        kept[nkept++] = best;
    }
    if (nkept < KEEP_CHECKPOINTS) return;
    for (int i = 0; i < n; i++) {
        if (steps[i] >= kept[nkept - 1]) continue;
        char p[4200];
        step_dir(p, sizeof p, dir, steps[i]);
        remove_tree(p);
    }
}

int checkpoint_finish(const char *dir, int64_t step, int world, const char *config_text, checkpoint_app_fn app,
                      void *arg, char *err, size_t errlen) {
    char path[4200], d[4096];
    checkpoint_path(path, sizeof path, dir, step, "config.txt");
    struct iovec cfg = {(void *)config_text, strlen(config_text)};
    if (write_file_atomic(path, &cfg, 1, err, errlen) != 0) return -1;
    step_dir(d, sizeof d, dir, step);
    if (app && app(arg, d, step, world, err, errlen) != 0) return -1;
    checkpoint_path(path, sizeof path, dir, step, "DONE");
    char done[64];
    int n = snprintf(done, sizeof done, "%" PRId64 "\n", step);
    struct iovec mark = {done, (size_t)n};
    if (write_file_atomic(path, &mark, 1, err, errlen) != 0) return -1;
    prune(dir);
    return 0;
}

int64_t checkpoint_latest(const char *dir, char *err, size_t errlen) {
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    DIR *d = opendir(ck);
    if (!d) { snprintf(err, errlen, "%s: no checkpoints (%s)", ck, strerror(errno)); return -1; }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        if (parse_step_dir(e->d_name, &s) == 0 && s > best && is_complete(dir, s)) best = s;
    }
    closedir(d);
    if (best < 0) snprintf(err, errlen, "%s: no complete checkpoint (none has DONE)", ck);
    return best;
}
