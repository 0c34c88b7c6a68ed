/* test_checkpoint.c — the persistent tier (checkpoint.h) on a temporary directory: the newest
 * complete checkpoint is found and incomplete ones ignored, only the two newest complete
 * checkpoints are kept, a state file reads back byte for byte and a corrupt or truncated one
 * is refused with a message that names it (the restore paths of --resume), and the
 * application's callback runs inside the step directory before DONE (a failing one leaves no
 * DONE). */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checksum.h"
#include "harness.h"
#include "protocol.h"
#include "replica.h"
#include "snapshot.h"

#define JOB "ckpttest"
#define WORLD 2
#define LEN_A 100
#define LEN_B 3000

static char g_root[256]; /* the temporary directory, removed at the end */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_root(void) {
    if (g_root[0]) nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh job output directory under the temporary root. */
static const char *new_dir(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_root, name);
    mkdir(dir, 0755);
    return dir;
}

/* The payload of rank's state at step: two regions of deterministic bytes. */
static void payload(unsigned char *a, unsigned char *b, int rank, int64_t step) {
    uint32_t x = (uint32_t)(rank * 7919 + step * 104729 + 1);
    for (int i = 0; i < LEN_A; i++) { x = x * 1664525u + 1013904223u; a[i] = (unsigned char)(x >> 24); }
    for (int i = 0; i < LEN_B; i++) { x = x * 1664525u + 1013904223u; b[i] = (unsigned char)(x >> 24); }
}

/* Writes every rank's state file of `step` (through checkpoint_write_shard with a header built
 * here when `by_header`, else through checkpoint_write_live), then completes it when `finish`. */
static int write_checkpoint(const char *dir, int64_t step, int finish, int by_header) {
    char err[512];
    unsigned char a[LEN_A], b[LEN_B];
    for (int rank = 0; rank < WORLD; rank++) {
        payload(a, b, rank, step);
        SnapRegion regions[2] = {{a, LEN_A}, {b, LEN_B}};
        int rc;
        if (by_header) {
            SnapHeader h;
            memset(&h, 0, sizeof h);
            h.magic = SNAP_MAGIC;
            h.version = SNAP_VERSION;
            snprintf(h.job, sizeof h.job, "%s", JOB);
            h.epoch = 1;
            h.rank = rank;
            h.world = WORLD;
            h.step = step;
            h.length = LEN_A + LEN_B;
            h.crc = crc32c(crc32c(0, a, LEN_A), b, LEN_B);
            snap_header_seal(&h);
            rc = checkpoint_write_shard(dir, &h, regions, 2, err, sizeof err);
        } else {
            rc = checkpoint_write_live(dir, JOB, 1, rank, WORLD, step, regions, 2, err, sizeof err);
        }
        CHECK(rc == 0, "write rank %d step %" PRId64 ": %s", rank, step, err);
        if (rc != 0) return -1;
    }
    if (!finish) return 0;
    int rc = checkpoint_finish(dir, step, WORLD, "workers=2\n", NULL, NULL, -1, err, sizeof err);
    CHECK(rc == 0, "finish step %" PRId64 ": %s", step, err);
    return rc;
}

static int exists(const char *dir, int64_t step, const char *file) {
    char path[4200];
    checkpoint_path(path, sizeof path, dir, step, file);
    return access(path, F_OK) == 0;
}

static void test_latest_none(void) {
    const char *dir = new_dir("none");
    char err[512] = "";
    CHECK(checkpoint_latest(dir, err, sizeof err) == -1, "no ckpt directory");
    CHECK(strstr(err, "ckpt") != NULL, "says where it looked: %s", err);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    mkdir(ck, 0755);
    err[0] = 0;
    CHECK(checkpoint_latest(dir, err, sizeof err) == -1 && strstr(err, "no complete checkpoint"), "%s", err);
}

static void test_latest_ignores_incomplete(void) {
    const char *dir = new_dir("latest");
    char err[512] = "", junk[700];
    write_checkpoint(dir, 4, 1, 0);
    write_checkpoint(dir, 9, 0, 0); /* every state file, no DONE */
    snprintf(junk, sizeof junk, "%s/ckpt/step_abc", dir);
    mkdir(junk, 0755);
    snprintf(junk, sizeof junk, "%s/ckpt/other", dir);
    mkdir(junk, 0755);
    CHECK(exists(dir, 9, "rank_00001.state") && !exists(dir, 9, "DONE"), "step 9 is incomplete");
    int64_t s = checkpoint_latest(dir, err, sizeof err);
    CHECK(s == 4, "latest %" PRId64 " (%s), want 4: a checkpoint without DONE is ignored", s, err);
    char path[4200];
    checkpoint_path(path, sizeof path, dir, 4, "DONE");
    CHECK(strstr(path, "/ckpt/step_000000005/DONE") != NULL, "directories count steps completed: %s", path);
    FILE *f = fopen(path, "r");
    long long v = -1;
    CHECK(f && fscanf(f, "%lld", &v) == 1 && v == 4, "DONE holds the step: %lld", v);
    if (f) fclose(f);
    CHECK(exists(dir, 4, "config.txt"), "config.txt written");
    write_checkpoint(dir, 9, 1, 0);
    s = checkpoint_latest(dir, err, sizeof err);
    CHECK(s == 9, "latest %" PRId64 " after completing step 9", s);
}

static void test_prune_keeps_two(void) {
    const char *dir = new_dir("prune");
    char err[512];
    write_checkpoint(dir, 0, 0, 1); /* incomplete, older than everything */
    write_checkpoint(dir, 1, 1, 1);
    CHECK(exists(dir, 0, "rank_00000.state") && exists(dir, 1, "DONE"), "one complete: nothing pruned yet");
    write_checkpoint(dir, 3, 1, 1);
    CHECK(exists(dir, 1, "DONE") && exists(dir, 3, "DONE"), "two complete ones kept");
    CHECK(!exists(dir, 0, "rank_00000.state"), "an incomplete one older than both kept is removed");
    write_checkpoint(dir, 4, 0, 1); /* incomplete, between the two newest */
    write_checkpoint(dir, 7, 0, 1); /* incomplete, newer than all: in progress */
    write_checkpoint(dir, 5, 1, 1);
    CHECK(exists(dir, 5, "DONE") && exists(dir, 3, "DONE"), "the two newest complete ones are kept");
    char path[4200];
    checkpoint_path(path, sizeof path, dir, 1, "");
    struct stat st;
    CHECK(stat(path, &st) != 0 && errno == ENOENT, "step 1's directory is gone: %s", path);
    CHECK(exists(dir, 4, "rank_00001.state") && exists(dir, 7, "rank_00001.state"),
          "anything newer than the oldest kept stays (a checkpoint in progress)");
    CHECK(checkpoint_latest(dir, err, sizeof err) == 5, "latest is 5");
    /* The two that are kept read back. */
    for (int64_t step = 3; step <= 5; step += 2)
        for (int rank = 0; rank < WORLD; rank++) {
            SnapHeader h;
            void *p = NULL;
            int rc = checkpoint_read_shard(dir, step, rank, &h, &p, err, sizeof err);
            CHECK(rc == 0, "%s", err);
            free(p);
        }
}

static void test_read_shard_roundtrip(void) {
    const char *dir = new_dir("read");
    char err[512] = "";
    write_checkpoint(dir, 6, 1, 0);
    unsigned char a[LEN_A], b[LEN_B];
    for (int rank = 0; rank < WORLD; rank++) {
        SnapHeader h;
        void *p = NULL;
        int rc = checkpoint_read_shard(dir, 6, rank, &h, &p, err, sizeof err);
        CHECK(rc == 0, "%s", err);
        if (rc != 0) continue;
        payload(a, b, rank, 6);
        CHECK(h.rank == rank && h.step == 6 && h.world == WORLD && h.epoch == 1 && h.length == LEN_A + LEN_B &&
                  !strcmp(h.job, JOB),
              "header rank %d step %" PRId64 " length %" PRIu64, h.rank, h.step, h.length);
        CHECK(memcmp(p, a, LEN_A) == 0 && memcmp((char *)p + LEN_A, b, LEN_B) == 0, "payload of rank %d", rank);
        free(p);
    }
    /* The same file from the step directory, with any step (as --resume reads it). */
    char sd[4200];
    checkpoint_path(sd, sizeof sd, dir, 6, "");
    sd[strlen(sd) - 1] = 0; /* drop the trailing slash */
    SnapHeader h;
    void *p = NULL;
    CHECK(checkpoint_read_state(sd, 1, -1, &h, &p, err, sizeof err) == 0 && h.step == 6, "%s", err);
    free(p);
    p = NULL;
    /* A file that is not what was asked for. */
    CHECK(checkpoint_read_state(sd, 1, 5, &h, &p, err, sizeof err) != 0 && strstr(err, "rank_00001.state") &&
              strstr(err, "expected rank 1 step 5") && p == NULL,
          "%s", err);
    CHECK(checkpoint_read_shard(dir, 6, 2, &h, &p, err, sizeof err) != 0 && strstr(err, "rank_00002.state") &&
              strstr(err, "cannot open") && p == NULL,
          "%s", err);
}

/* Rewrites byte `off` of a file to its complement. */
static int flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int c = -1;
    if (fseek(f, off, SEEK_SET) == 0) c = fgetc(f);
    int rc = -1;
    if (c != EOF && fseek(f, off, SEEK_SET) == 0 && fputc(~c & 0xff, f) != EOF) rc = 0;
    fclose(f);
    return rc;
}

static void test_read_shard_corrupt(void) {
    const char *dir = new_dir("corrupt");
    char err[512] = "", path[4200];
    write_checkpoint(dir, 2, 1, 0);
    SnapHeader h;
    void *p = NULL;
    /* One flipped payload byte: the CRC32C says so. */
    checkpoint_path(path, sizeof path, dir, 2, "rank_00001.state");
    CHECK(flip_byte(path, (long)sizeof(SnapHeader) + LEN_A + 17) == 0, "flip %s", path);
    CHECK(checkpoint_read_shard(dir, 2, 1, &h, &p, err, sizeof err) == -1, "a flipped payload byte is refused");
    CHECK(strstr(err, path) && strstr(err, "checksum mismatch"), "names the file and the CRC: %s", err);
    CHECK(p == NULL, "no payload on failure");
    /* One flipped header byte. */
    checkpoint_path(path, sizeof path, dir, 2, "rank_00000.state");
    CHECK(flip_byte(path, 50) == 0, "flip %s", path);
    CHECK(checkpoint_read_shard(dir, 2, 0, &h, &p, err, sizeof err) == -1 && strstr(err, path), "header: %s", err);
}

static void test_read_shard_truncated(void) {
    const char *dir = new_dir("truncated");
    char err[512] = "", path[4200];
    write_checkpoint(dir, 3, 1, 0);
    SnapHeader h;
    void *p = NULL;
    checkpoint_path(path, sizeof path, dir, 3, "rank_00001.state");
    CHECK(truncate(path, (off_t)sizeof(SnapHeader) + LEN_A + LEN_B - 5) == 0, "truncate %s", path);
    CHECK(checkpoint_read_shard(dir, 3, 1, &h, &p, err, sizeof err) == -1, "a truncated payload is refused");
    CHECK(strstr(err, path) && strstr(err, "differs from its header"), "names the file: %s", err);
    CHECK(p == NULL, "no payload on failure");
    CHECK(truncate(path, 20) == 0, "truncate %s", path);
    CHECK(checkpoint_read_shard(dir, 3, 1, &h, &p, err, sizeof err) == -1 && strstr(err, path) &&
              strstr(err, "header truncated"),
          "%s", err);
    /* A longer file than its header says is refused too. */
    checkpoint_path(path, sizeof path, dir, 3, "rank_00000.state");
    FILE *f = fopen(path, "ab");
    CHECK(f && fputc('x', f) != EOF, "append");
    if (f) fclose(f);
    CHECK(checkpoint_read_shard(dir, 3, 0, &h, &p, err, sizeof err) == -1 && strstr(err, path), "%s", err);
}

typedef struct {
    int calls;
    char step_dir[4200];
    int64_t step;
    int world;
    int had_config, had_done;
    int fail;
} AppSeen;

static int app_callback(void *arg, const char *step_dir, int64_t step, int world, char *err, size_t errlen) {
    AppSeen *s = arg;
    s->calls++;
    snprintf(s->step_dir, sizeof s->step_dir, "%s", step_dir);
    s->step = step;
    s->world = world;
    char path[4400];
    snprintf(path, sizeof path, "%s/config.txt", step_dir);
    s->had_config = access(path, F_OK) == 0;
    snprintf(path, sizeof path, "%s/DONE", step_dir);
    s->had_done = access(path, F_OK) == 0;
    if (s->fail) {
        snprintf(err, errlen, "the application could not write its model");
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.bin", step_dir);
    FILE *f = fopen(path, "wb");
    if (!f) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    fputs("model", f);
    fclose(f);
    return 0;
}

static void test_finish_app_callback(void) {
    const char *dir = new_dir("app");
    char err[512] = "", want[4200];
    write_checkpoint(dir, 7, 0, 0);
    AppSeen seen;
    memset(&seen, 0, sizeof seen);
    int rc = checkpoint_finish(dir, 7, WORLD, "workers=2\n", app_callback, &seen, -1, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    CHECK(seen.calls == 1 && seen.step == 7 && seen.world == WORLD, "calls %d step %" PRId64 " world %d", seen.calls,
          seen.step, seen.world);
    snprintf(want, sizeof want, "%s/ckpt/step_000000008", dir);
    CHECK(!strcmp(seen.step_dir, want), "step directory '%s', want '%s'", seen.step_dir, want);
    CHECK(seen.had_config && !seen.had_done, "the callback runs after config.txt, before DONE");
    CHECK(exists(dir, 7, "model.bin") && exists(dir, 7, "DONE"), "the application's file and DONE");
    CHECK(checkpoint_latest(dir, err, sizeof err) == 7, "complete");
}

static void test_finish_failing_callback(void) {
    const char *dir = new_dir("appfail");
    char err[512] = "";
    write_checkpoint(dir, 2, 1, 0);
    write_checkpoint(dir, 8, 0, 0);
    AppSeen seen;
    memset(&seen, 0, sizeof seen);
    seen.fail = 1;
    int rc = checkpoint_finish(dir, 8, WORLD, "workers=2\n", app_callback, &seen, -1, err, sizeof err);
    CHECK(rc == -1, "a failing callback fails the checkpoint");
    CHECK(strstr(err, "could not write its model") != NULL, "its message comes back: %s", err);
    CHECK(seen.calls == 1, "called once");
    CHECK(!exists(dir, 8, "DONE"), "no DONE after a failing callback");
    CHECK(checkpoint_latest(dir, err, sizeof err) == 2, "the previous checkpoint stays the newest");
    CHECK(exists(dir, 2, "DONE"), "nothing pruned");
}

/* The checkpoint a running job resumed from is pinned: rotation keeps it beside the two newest
 * (a spare that starts late reads its model there; issue 47), and so does the pruning across
 * machines; unpinned, both take it. */
static void test_prune_keeps_the_pinned(void) {
    const char *dir = new_dir("pinned");
    char err[512] = "";
    write_checkpoint(dir, 1, 1, 1); /* the resumed one */
    for (int64_t step = 3; step <= 7; step += 2) {
        write_checkpoint(dir, step, 0, 1);
        CHECK(checkpoint_finish(dir, step, WORLD, "workers=2\n", NULL, NULL, 1, err, sizeof err) == 0, "%s", err);
    }
    CHECK(exists(dir, 1, "DONE") && exists(dir, 1, "rank_00001.state"), "the pinned step 2 stays whole");
    CHECK(!exists(dir, 3, "DONE") && exists(dir, 5, "DONE") && exists(dir, 7, "DONE"),
          "the others rotate as before: the two newest kept");
    checkpoint_prune_below(dir, 7, 1);
    CHECK(exists(dir, 1, "DONE") && !exists(dir, 5, "DONE") && exists(dir, 7, "DONE"), "pruning below 8 keeps 2 too");
    checkpoint_prune_below(dir, 7, -1);
    CHECK(!exists(dir, 1, "DONE") && exists(dir, 7, "DONE"), "unpinned, it goes");
    write_checkpoint(dir, 9, 1, 1);
    write_checkpoint(dir, 11, 1, 1);
    CHECK(!exists(dir, 7, "DONE"), "and plain rotation is unchanged");
}

/* --resume verifies every file: a damaged application file (model.bin) or rank state in the
 * newest checkpoint makes it fall back to the older intact one, naming the damaged file. */
static void test_resume_falls_back_to_intact(void) {
    const char *dir = new_dir("manifest");
    char err[512] = "", path[4200];
    AppSeen seen;
    for (int64_t step = 3; step <= 6; step += 3) {
        write_checkpoint(dir, step, 0, 0);
        memset(&seen, 0, sizeof seen);
        CHECK(checkpoint_finish(dir, step, WORLD, "workers=2\n", app_callback, &seen, -1, err, sizeof err) == 0, "%s", err);
    }
    CHECK(exists(dir, 6, "MANIFEST") && checkpoint_verify(dir, 6, err, sizeof err) == 0, "intact: %s", err);
    CHECK(checkpoint_latest_intact(dir, err, sizeof err) == 6, "newest intact: %s", err);
    checkpoint_path(path, sizeof path, dir, 6, "model.bin");
    CHECK(flip_byte(path, 2) == 0, "flip");
    CHECK(checkpoint_verify(dir, 6, err, sizeof err) != 0 && strstr(err, "model.bin") && strstr(err, "checksum"),
          "a flipped byte in the application's file is found: %s", err);
    CHECK(checkpoint_latest_intact(dir, err, sizeof err) == 3, "falls back to step 4");
    checkpoint_path(path, sizeof path, dir, 3, "rank_00001.state");
    CHECK(flip_byte(path, 200) == 0, "flip");
    CHECK(checkpoint_latest_intact(dir, err, sizeof err) == -1 && strstr(err, "no intact checkpoint"), "%s", err);
    CHECK(checkpoint_latest(dir, err, sizeof err) == 6, "the cheap lookup still sees DONE");
}

/* A machine's inventory (protocol.h's text, for --resume across machines): newest step first,
 * each step's ranks ascending and once (a second name of a rank's file is not a second
 * rank), a damaged state file not offered, and -1 when it does not fit. */
static void test_inventory(void) {
    const char *dir = new_dir("inventory");
    char err[512] = "", inv[256], path[4200], copy[4200];
    write_checkpoint(dir, 4, 1, 0);
    write_checkpoint(dir, 9, 0, 0);
    unsigned char a[LEN_A], b[LEN_B];
    payload(a, b, 1, 12);
    SnapRegion regions[2] = {{a, LEN_A}, {b, LEN_B}};
    CHECK(checkpoint_write_live(dir, JOB, 1, 1, WORLD, 12, regions, 2, err, sizeof err) == 0, "%s", err);
    checkpoint_path(path, sizeof path, dir, 12, "rank_00001.state");
    checkpoint_path(copy, sizeof copy, dir, 12, "rank_1.state");
    CHECK(link(path, copy) == 0, "link %s: %s", copy, strerror(errno));
    checkpoint_path(path, sizeof path, dir, 9, "rank_00000.state");
    CHECK(flip_byte(path, (long)sizeof(SnapHeader) + 3) == 0, "flip %s", path);
    CHECK(checkpoint_inventory(dir, inv, sizeof inv) == 0 && !strcmp(inv, "12:1;9:1;4:0,1"), "inventory '%s'", inv);
    InventoryEntry e[8];
    CHECK(inventory_parse(inv, e, 8, err, sizeof err) == 4 && e[0].step == 12 && e[3].rank == 1, "parse: %s", err);
    CHECK(checkpoint_inventory(dir, inv, 8) == -1, "an inventory that does not fit");
    CHECK(checkpoint_inventory(new_dir("inventory-none"), inv, sizeof inv) == 0 && !inv[0], "no checkpoint: '%s'", inv);
}

static void test_cleanup(void) {
    remove_root();
    struct stat st;
    CHECK(stat(g_root, &st) != 0 && errno == ENOENT, "temporary directory %s removed", g_root);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s/dp_ckpt_XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN_TEST(test_latest_none);
    RUN_TEST(test_latest_ignores_incomplete);
    RUN_TEST(test_prune_keeps_two);
    RUN_TEST(test_prune_keeps_the_pinned);
    RUN_TEST(test_read_shard_roundtrip);
    RUN_TEST(test_read_shard_corrupt);
    RUN_TEST(test_read_shard_truncated);
    RUN_TEST(test_finish_app_callback);
    RUN_TEST(test_finish_failing_callback);
    RUN_TEST(test_resume_falls_back_to_intact);
    RUN_TEST(test_inventory);
    RUN_TEST(test_cleanup);
    TEST_MAIN_END();
}
