/* checkpoint.c — writes, completes, finds and reads checkpoints of the persistent tier. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "checksum.h"
#include "protocol.h"
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
    if (dir_is_private(d, err, errlen) != 0) return -1; /* a step_N planted as a link is never written through */
    shard_path(path, sizeof path, dir, h->step, h->rank);
    struct iovec *parts = malloc(((size_t)nregions + 1) * sizeof *parts);
    if (!parts) { snprintf(err, errlen, "out of memory"); return -1; }
    parts[0] = (struct iovec){(void *)h, sizeof *h};
    for (int i = 0; i < nregions; i++) parts[i + 1] = (struct iovec){(void *)regions[i].ptr, regions[i].len};
    int rc = write_file_atomic(path, parts, nregions + 1, err, errlen);
    free(parts);
    if (rc != 0) rmdir(d); /* a step directory this left empty (a full disk) goes; another rank's files keep it */
    return rc;
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
    FILE *f = fopen_regular(path, err, errlen); /* a FIFO or a link to /dev/zero would never end */
    if (!f) return -1;
    int rc = -1;
    const char *bad;
    if (fread(h, sizeof *h, 1, f) != 1) { snprintf(err, errlen, "%s: state header truncated", path); goto out; }
    if ((bad = snap_header_check(h)) != NULL) { snprintf(err, errlen, "%s: %s", path, bad); goto out; }
    if (h->rank != rank || (step >= 0 && h->step != step)) {
        snprintf(err, errlen, "%s: header says rank %d step %" PRId64 ", expected rank %d step %" PRId64, path, h->rank,
                 h->step, rank, step);
        goto out;
    }
    /* The file must hold what its header says before anything is sized from it: a corrupt
     * length would otherwise allocate up to 64 GiB for a file of a few bytes. */
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size != sizeof *h + h->length) {
        snprintf(err, errlen, "%s: state size of %lld bytes differs from its header's %zu + %" PRIu64
                 " bytes (truncated or corrupt)", path, (long long)st.st_size, sizeof *h, h->length);
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

/* Removes a step directory and the files in it, following no link: a step_N that is a link
 * (to somebody's directory) is itself removed, never what it points to; so are links inside. */
static void remove_tree(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR) unlink(path);
        return;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        unlinkat(fd, e->d_name, 0); /* a link goes, not its target; a directory stays (none is written) */
    }
    closedir(d);
    rmdir(path);
}

/* Keeps the KEEP_CHECKPOINTS newest complete checkpoints, anything newer than the oldest kept,
 * and step `pinned`. */
static void prune(const char *dir, int64_t pinned) {
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
        if (steps[i] >= kept[nkept - 1] || steps[i] == pinned) continue;
        char p[4200];
        step_dir(p, sizeof p, dir, steps[i]);
        remove_tree(p);
    }
}

/* CRC32C and size of a whole file. 0 / -1 + err. */
static int file_crc(const char *path, uint32_t *crc, uint64_t *size, char *err, size_t errlen) {
    FILE *f = fopen_regular(path, err, errlen);
    if (!f) return -1;
    static _Thread_local unsigned char buf[1 << 16];
    size_t n;
    *crc = 0;
    *size = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = crc32c(*crc, buf, n);
        *size += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { snprintf(err, errlen, "%s: read error", path); return -1; }
    return 0;
}

/* MANIFEST: "world N" then "crc32c size name" for every file of the checkpoint (the ranks'
 * states, config.txt, the application's files), so a resume verifies everything it reads. */
static int write_manifest(const char *d, int world, char *err, size_t errlen) {
    DIR *dir = opendir(d);
    if (!dir) { snprintf(err, errlen, "%s: cannot list: %s", d, strerror(errno)); return -1; }
    size_t cap = 4096, used = 0;
    char *text = malloc(cap);
    int rc = text ? 0 : -1;
    if (text) used = (size_t)snprintf(text, cap, "world %d\n", world);
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "DONE") || !strcmp(e->d_name, "MANIFEST") ||
            strstr(e->d_name, ".tmp."))
            continue;
        char path[4400];
        uint32_t crc;
        uint64_t size;
        snprintf(path, sizeof path, "%.4000s/%.255s", d, e->d_name);
        if ((rc = file_crc(path, &crc, &size, err, errlen)) != 0) break;
        if (used + 300 > cap) {
            char *grown = realloc(text, cap *= 2);
            if (!grown) { rc = -1; break; }
            text = grown;
        }
        used += (size_t)snprintf(text + used, cap - used, "%08x %" PRIu64 " %s\n", crc, size, e->d_name);
    }
    closedir(dir);
    if (rc == 0 && text) {
        char path[4200];
        snprintf(path, sizeof path, "%s/MANIFEST", d);
        struct iovec part = {text, used};
        rc = write_file_atomic(path, &part, 1, err, errlen);
    } else if (!text) {
        snprintf(err, errlen, "out of memory");
    }
    free(text);
    return rc;
}

int checkpoint_finish(const char *dir, int64_t step, int world, const char *config_text, checkpoint_app_fn app,
                      void *arg, int64_t pinned, char *err, size_t errlen) {
    char path[4200], d[4096];
    step_dir(d, sizeof d, dir, step);
    checkpoint_path(path, sizeof path, dir, step, "config.txt");
    struct iovec cfg = {(void *)config_text, strlen(config_text)};
    int rc = write_file_atomic(path, &cfg, 1, err, errlen);
    if (rc == 0 && app) rc = app(arg, d, step, world, err, errlen);
    if (rc == 0) rc = write_manifest(d, world, err, errlen);
    if (rc == 0) {
        checkpoint_path(path, sizeof path, dir, step, "DONE");
        char done[64];
        int n = snprintf(done, sizeof done, "%" PRId64 "\n", step);
        struct iovec mark = {done, (size_t)n};
        rc = write_file_atomic(path, &mark, 1, err, errlen);
    }
    if (rc != 0) { /* a checkpoint that failed partway is removed, never left half there */
        remove_tree(d);
        return -1;
    }
    prune(dir, pinned);
    return 0;
}

int checkpoint_verify(const char *dir, int64_t step, char *err, size_t errlen) {
    char d[4096], path[4200], line[600];
    step_dir(d, sizeof d, dir, step);
    if (!is_complete(dir, step)) { snprintf(err, errlen, "%s: incomplete (no DONE)", d); return -1; }
    if (dir_is_private(d, err, errlen) != 0) return -1; /* nobody else put its files in it */
    snprintf(path, sizeof path, "%s/MANIFEST", d);
    FILE *f = fopen_regular(path, err, errlen);
    if (!f) return -1;
    int world = -1, states = 0, rc = 0, lineno = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        unsigned crc;
        unsigned long long size;
        char name[300];
        if (lineno == 1) {
            if (sscanf(line, "world %d", &world) != 1 || world < 1) {
                snprintf(err, errlen, "%s:1: expected 'world N', found '%.60s'", path, line);
                rc = -1;
            }
            continue;
        }
        if (sscanf(line, "%8x %llu %299s", &crc, &size, name) != 3 || strchr(name, '/')) {
            snprintf(err, errlen, "%s:%d: expected 'crc32c size name', found '%.60s'", path, lineno, line);
            rc = -1;
            break;
        }
        char file[4400];
        uint32_t got;
        uint64_t got_size;
        snprintf(file, sizeof file, "%.4000s/%.299s", d, name);
        if ((rc = file_crc(file, &got, &got_size, err, errlen)) != 0) break;
        if (got != crc || got_size != size) {
            snprintf(err, errlen, "%s: checksum mismatch (CRC32C %08x, %llu bytes; the manifest says %08x, %llu bytes)",
                     file, got, (unsigned long long)got_size, crc, size);
            rc = -1;
        }
        if (!strncmp(name, "rank_", 5)) states++;
    }
    fclose(f);
    if (rc == 0 && states != world) {
        snprintf(err, errlen, "%s: %d rank states listed, expected %d", path, states, world);
        rc = -1;
    }
    return rc;
}

int64_t checkpoint_latest_intact(const char *dir, char *err, size_t errlen) {
    int64_t below = INT64_MAX;
    char skipped[1024] = "";
    for (;;) {
        int64_t s = checkpoint_latest_below(dir, below, err, errlen);
        if (s < 0) {
            if (skipped[0]) snprintf(err, errlen, "no intact checkpoint: %s", skipped);
            return -1;
        }
        char why[1024];
        if (checkpoint_verify(dir, s, why, sizeof why) == 0) {
            if (skipped[0]) log_msg("%s; using the checkpoint of step %lld instead", skipped, (long long)s + 1);
            return s;
        }
        if (!skipped[0]) snprintf(skipped, sizeof skipped, "the checkpoint of step %lld is damaged (%.800s)", (long long)s + 1, why);
        below = s;
    }
}

int64_t checkpoint_latest(const char *dir, char *err, size_t errlen) {
    return checkpoint_latest_below(dir, INT64_MAX, err, errlen);
}

int64_t checkpoint_latest_below(const char *dir, int64_t below, char *err, size_t errlen) {
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    DIR *d = opendir(ck);
    if (!d) { snprintf(err, errlen, "%s: no checkpoints (%s)", ck, strerror(errno)); return -1; }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        if (parse_step_dir(e->d_name, &s) == 0 && s > best && s < below && is_complete(dir, s)) best = s;
    }
    closedir(d);
    if (best < 0) snprintf(err, errlen, "%s: no complete checkpoint (none has DONE)", ck);
    return best;
}

/* Every step directory in DIR (0-based steps), newest first; the count (at most max). */
static int step_dirs(const char *dir, int64_t *steps, int max) {
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    DIR *d = opendir(ck);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        int64_t s;
        if (parse_step_dir(e->d_name, &s) == 0) steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* newest first */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

int checkpoint_inventory(const char *dir, char *out, size_t len) {
    int64_t steps[4096];
    int n = step_dirs(dir, steps, 4096), k = 0, rc = 0;
    InventoryEntry *inv = malloc(sizeof *inv * INVENTORY_ENTRIES_MAX);
    char *have = malloc(DP_MAX_RANKS);
    if (len) out[0] = 0;
    if (!inv || !have) rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (i > 0 && steps[i] == steps[i - 1]) continue; /* two names of one step: listed once */
        char d[4096];
        step_dir(d, sizeof d, dir, steps[i]);
        DIR *sd = opendir(d);
        if (!sd) continue;
        memset(have, 0, DP_MAX_RANKS);
        struct dirent *e;
        while ((e = readdir(sd)) != NULL) {
            int rank;
            char tail;
            if (sscanf(e->d_name, "rank_%d.stat%c", &rank, &tail) != 2 || tail != 'e' || rank < 0) continue;
            if (rank >= DP_MAX_RANKS) { log_msg("checkpoint inventory: %s/%s: rank beyond %d", d, e->d_name, DP_MAX_RANKS); continue; }
            SnapHeader h;
            void *payload = NULL;
            char err[256];
            if (checkpoint_read_state(d, rank, steps[i], &h, &payload, err, sizeof err) != 0) {
                log_msg("checkpoint inventory: %s", err); /* damaged: not offered */
                continue;
            }
            free(payload);
            have[rank] = 1;
        }
        closedir(sd);
        for (int r = 0; r < DP_MAX_RANKS && rc == 0; r++) /* protocol.h's order: ranks ascending */
            if (have[r]) {
                if (k == INVENTORY_ENTRIES_MAX) rc = -1;
                else inv[k++] = (InventoryEntry){.step = steps[i], .rank = r};
            }
    }
    if (rc == 0) rc = inventory_format(inv, k, out, len);
    free(inv);
    free(have);
    return rc;
}

int checkpoint_write_config(const char *dir, int64_t step, const char *text, char *err, size_t errlen) {
    char path[4200];
    checkpoint_path(path, sizeof path, dir, step, "config.txt");
    if (access(path, F_OK) == 0) return 0;
    struct iovec part = {(void *)text, strlen(text)};
    return write_file_atomic(path, &part, 1, err, errlen);
}

int64_t checkpoint_latest_config(const char *dir, char *err, size_t errlen) {
    int64_t steps[4096];
    int n = step_dirs(dir, steps, 4096);
    for (int i = 0; i < n; i++) {
        char path[4200];
        checkpoint_path(path, sizeof path, dir, steps[i], "config.txt");
        if (access(path, R_OK) == 0) return steps[i];
    }
    snprintf(err, errlen, "%s/ckpt: no checkpoint with a config.txt", dir);
    return -1;
}

void checkpoint_prune_below(const char *dir, int64_t step, int64_t pinned) {
    int64_t steps[4096];
    int n = step_dirs(dir, steps, 4096);
    for (int i = 0; i < n; i++) {
        if (steps[i] >= step || steps[i] == pinned) continue;
        char p[4200];
        step_dir(p, sizeof p, dir, steps[i]);
        remove_tree(p);
    }
}
