/* test_snapshot.c — the ping-pong snapshot engine against a real replica holder on loopback:
 * replicas equal the live state byte for byte, the loop never sees a torn copy, and a rank
 * killed mid-replication leaves the previous committed generation intact and usable; the
 * buffers here and on the holder are faulted in before the first capture; an engine without
 * the job's key replicates nothing; a generation's local part is kept but not sent; and which of a rank's two blocks holds each generation of
 * its declared state (gen_block). */
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checksum.h"
#include "generation.h"
#include "harness.h"
#include "replica.h"
#include "snapshot.h"
#include "util.h"

#define JOB "snaptest"
#define WORLD 4

/* The job's channel key, as every process of a job derives it from the job's secret. */
static unsigned char KEY[REPLICA_KEY_BYTES];

static void fill(unsigned char *buf, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
}

/* The payload a holder has for `rank` at generation `step` equals the concatenated regions. */
static int replica_equals(ReplicaServer *srv, int rank, int64_t step, const SnapRegion *r, int n) {
    SnapHeader h;
    void *payload = NULL;
    if (replica_server_lookup(srv, rank, step, &h, &payload) != REPLICA_OK) return 0;
    int same = h.step == step && h.rank == rank;
    size_t off = 0;
    for (int i = 0; i < n && same; i++) {
        same = memcmp((char *)payload + off, r[i].ptr, r[i].len) == 0;
        off += r[i].len;
    }
    same = same && off == h.length;
    free(payload);
    return same;
}

/* Which payloads carry state of their rank's own (decide.h: a rank without any loses nothing). */
static void test_gen_own_state(void) {
    unsigned char buf[512];
    float a[4] = {1, 2, 3, 4};
    dp_region same[2] = {{1, DP_IDENTICAL, a, sizeof a}, {2, DP_IDENTICAL, a, 8}};
    gen_head_write(buf, 7, 1, same, 2, NULL, 0);
    size_t len = gen_head_bytes(2, 0) + sizeof a + 8;
    CHECK(gen_own_state(buf, len) == 0, "identical regions only, no extra: nothing of its own");
    gen_head_write(buf, 7, 1, NULL, 0, NULL, 0);
    CHECK(gen_own_state(buf, gen_head_bytes(0, 0)) == 0, "an empty generation");
    uint64_t cursor = 5;
    gen_head_write(buf, 7, 1, same, 2, &cursor, sizeof cursor);
    CHECK(gen_own_state(buf, len + sizeof cursor) == 1, "extra bytes are its own");
    same[1].kind = DP_SHARDED;
    gen_head_write(buf, 7, 1, same, 2, NULL, 0);
    CHECK(gen_own_state(buf, len) == 1, "a sharded region is its own");
    CHECK(gen_own_state(buf, 10) == 1 && gen_own_state(buf, sizeof(GenHead) + 4) == 1, "too short to tell: assume so");
}

static void test_replica_equals_live_state(void) {
    char err[256];
    ReplicaServer *srv = replica_server_start("127.0.0.1", 0, JOB, WORLD, 0 /* proc, as the targets say */, KEY, err, sizeof err);
    CHECK(srv != NULL, "%s", err);
    if (!srv) return;
    size_t n1 = 64, n2 = 3 << 20, n3 = 12345;
    unsigned char *a = malloc(n1), *b = malloc(n2), *c = malloc(n3);
    SnapRegion regions[3] = {{a, n1}, {b, n2}, {c, n3}};
    ReplicaTarget target = {"127.0.0.1", replica_server_port(srv), 0};
    SnapshotConfig sc = {.job = JOB, .epoch = 0, .rank = 2, .world = WORLD, .regions = regions, .nregions = 3,
                         .targets = &target, .ntargets = 1, .timeout_ms = 5000, .key = KEY};
    Snapshot *s = snapshot_create(&sc, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return;
    CHECK(snapshot_committed(s) == -1, "nothing committed yet");
    for (int step = 0; step < 5; step++) {
        snapshot_wait_previous(s, NULL); /* as the trainer does before it changes the live state */
        fill(a, n1, step * 3 + 1);
        fill(b, n2, step * 3 + 2);
        fill(c, n3, step * 3 + 3);
        snapshot_capture(s, step);
        CHECK(snapshot_drain(s, 5000) == 0, "generation %d not done in 5 s", step);
        CHECK(snapshot_committed(s) == step, "committed %lld, expected %d", (long long)snapshot_committed(s), step);
        CHECK(replica_equals(srv, 2, step, regions, 3), "replica of step %d differs from the live state", step);
    }
    /* Holders keep two generations: the previous one is still there, older ones are not. */
    SnapHeader h;
    void *p = NULL;
    CHECK(replica_server_lookup(srv, 2, 3, &h, &p) == REPLICA_OK && h.step == 3, "previous generation kept");
    free(p);
    p = NULL;
    CHECK(replica_server_lookup(srv, 2, 2, &h, &p) == REPLICA_NOT_FOUND, "older generation dropped");
    free(p);
    SnapshotStats st;
    snapshot_stats(s, &st);
    CHECK(st.commits == 5 && st.failures == 0 && st.bytes_replicated == 5 * (n1 + n2 + n3), "stats %llu %llu %llu",
          (unsigned long long)st.commits, (unsigned long long)st.failures, (unsigned long long)st.bytes_replicated);
    printf("  copy %.2f ms, replicate %.2f ms for %.1f MiB\n", st.copy_ms_last, st.replicate_ms_last, (n1 + n2 + n3) / 1048576.0);
    snapshot_destroy(s);
    replica_server_stop(srv);
    free(a);
    free(b);
    free(c);
}

/* The local part of a generation (state other ranks hold too) is committed with it and read
 * back by snapshot_local_use, but never sent: the holder's replica is the payload alone. */
static int local_seen(const SnapHeader *h, const void *payload, const void *local, size_t local_len, void *arg) {
    const SnapRegion *want = arg; /* [payload, local] */
    return h->length == want[0].len && memcmp(payload, want[0].ptr, want[0].len) == 0 && local_len == want[1].len &&
                   memcmp(local, want[1].ptr, want[1].len) == 0
               ? 0
               : -1;
}

static void test_local_part_not_replicated(void) {
    char err[256];
    ReplicaServer *srv = replica_server_start("127.0.0.1", 0, JOB, WORLD, 0 /* proc, as the targets say */, KEY, err, sizeof err);
    CHECK(srv != NULL, "%s", err);
    if (!srv) return;
    size_t n1 = 1000, n2 = 70000;
    unsigned char *own = malloc(n1), *same = malloc(n2), *ext = malloc(n1);
    SnapRegion mine = {own, n1}, local = {same, n2};
    ReplicaTarget target = {"127.0.0.1", replica_server_port(srv), 0};
    SnapshotConfig sc = {.job = JOB, .epoch = 0, .rank = 1, .world = WORLD, .targets = &target, .ntargets = 1,
                         .timeout_ms = 5000, .key = KEY};
    Snapshot *s = snapshot_create(&sc, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return;
    for (int step = 0; step < 4; step++) {
        snapshot_wait_previous(s, NULL);
        fill(own, n1, step * 2 + 1);
        fill(same, n2, step * 2 + 2);
        if (step % 2 == 0) CHECK(snapshot_capture_regions(s, step, &mine, 1, &local, 1) == 0, "capture %d", step);
        else { /* a zero-copy generation carries a local part too */
            memcpy(ext, own, n1);
            CHECK(snapshot_capture_external(s, step, ext, n1, &local, 1) == 0, "capture %d", step);
        }
        CHECK(snapshot_drain(s, 5000) == 0 && snapshot_committed(s) == step, "generation %d", step);
        CHECK(replica_equals(srv, 1, step, &mine, 1), "replica of step %d is not the payload alone", step);
        unsigned char *copy = malloc(n2);
        memcpy(copy, same, n2);
        SnapRegion want[2] = {{own, n1}, {copy, n2}};
        fill(same, n2, 99); /* the live state moves on: the local part must not */
        CHECK(snapshot_local_use(s, step, local_seen, want) == 0, "local part of step %d", step);
        free(copy);
    }
    /* A generation without a local part has none. */
    snapshot_wait_previous(s, NULL);
    CHECK(snapshot_capture_regions(s, 4, &mine, 1, NULL, 0) == 0 && snapshot_drain(s, 5000) == 0, "capture 4");
    SnapRegion none[2] = {{own, n1}, {same, 0}};
    CHECK(snapshot_local_use(s, 4, local_seen, none) == 0, "generation 4 has no local part");
    SnapshotStats st;
    snapshot_stats(s, &st);
    CHECK(st.bytes_replicated == 5 * n1, "replicated %llu bytes, expected %zu", (unsigned long long)st.bytes_replicated,
          5 * n1);
    snapshot_destroy(s);
    replica_server_stop(srv);
    free(own);
    free(same);
    free(ext);
}

/* The capture in flight blocks the next update only until it has read the live state; a
 * state changed right after snapshot_wait_previous returns is never seen by that generation:
 * every committed generation holds exactly the bytes that were live at its capture. */
static uint32_t expect_crc[20];
static int commits_seen, commits_wrong;

static void check_commit(const SnapHeader *h, const void *payload, void *arg) {
    (void)arg;
    commits_seen++;
    if (crc32c(0, payload, h->length) != expect_crc[h->step] || h->crc != expect_crc[h->step]) commits_wrong++;
}

static void test_wait_protects_generation(void) {
    char err[256];
    size_t n = 8 << 20;
    unsigned char *live = malloc(n);
    SnapRegion region = {live, n};
    SnapshotConfig sc = {.job = JOB, .rank = 0, .world = 1, .regions = &region, .nregions = 1, .timeout_ms = 5000,
                         .on_commit = check_commit};
    Snapshot *s = snapshot_create(&sc, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return;
    for (int step = 0; step < 20; step++) {
        snapshot_wait_previous(s, NULL);
        memset(live, step + 1, n);
        expect_crc[step] = crc32c(0, live, n);
        snapshot_capture(s, step);
    }
    CHECK(snapshot_drain(s, 5000) == 0, "drain");
    CHECK(snapshot_committed(s) == 19, "committed %lld", (long long)snapshot_committed(s));
    CHECK(commits_seen == 20 && commits_wrong == 0, "%d commits, %d with the wrong bytes", commits_seen, commits_wrong);
    SnapshotStats st;
    snapshot_stats(s, &st);
    printf("  %llu of 20 updates waited for the copy, %.2f ms in total\n", (unsigned long long)st.waits, st.wait_ms_total);
    snapshot_destroy(s);
    free(live);
}

/* A child process (a "rank") replicates generation 0 of a 48 MiB state, then is SIGKILLed in
 * the middle of copying/replicating generation 1. The holder (this process) still serves
 * generation 0, verified, byte for byte. */
static void test_rank_killed_mid_replication(void) {
    char err[256];
    ReplicaServer *srv = replica_server_start("127.0.0.1", 0, JOB, WORLD, 0 /* proc, as the targets say */, KEY, err, sizeof err);
    CHECK(srv != NULL, "%s", err);
    if (!srv) return;
    size_t n = 48 << 20;
    unsigned char *gen0 = malloc(n);
    fill(gen0, n, 77);
    int port = replica_server_port(srv);
    int ready[2];
    CHECK(pipe(ready) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *live = malloc(n);
        memcpy(live, gen0, n);
        SnapRegion region = {live, n};
        ReplicaTarget target = {"127.0.0.1", port, 0};
        SnapshotConfig sc = {.job = JOB, .rank = 1, .world = WORLD, .regions = &region, .nregions = 1,
                             .targets = &target, .ntargets = 1, .timeout_ms = 5000, .key = KEY};
        char e[256];
        Snapshot *s = snapshot_create(&sc, e, sizeof e);
        if (!s) _exit(2);
        snapshot_capture(s, 0);
        if (snapshot_drain(s, 5000) != 0 || snapshot_committed(s) != 0) _exit(3);
        snapshot_wait_previous(s, NULL);
        fill(live, n, 78);
        snapshot_capture(s, 1);
        if (write(ready[1], "x", 1) != 1) _exit(4);
        for (;;) pause(); /* killed while generation 1 is in flight */
    }
    char x;
    CHECK(read(ready[0], &x, 1) == 1, "child did not reach generation 1");
    usleep(3000); /* let the transfer of generation 1 start */
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status), "child exited on its own: status %d", status);
    usleep(100000);
    SnapHeader h;
    void *payload = NULL;
    replica_status st = replica_server_lookup(srv, 1, -1, &h, &payload);
    CHECK(st == REPLICA_OK, "lookup: %s", replica_status_str(st));
    if (st == REPLICA_OK) {
        /* Either generation 1 had fully arrived and verified before the kill, or generation 0
         * is intact; never a torn mix. */
        unsigned char *gen1 = malloc(n);
        fill(gen1, n, 78);
        int is0 = h.step == 0 && memcmp(payload, gen0, n) == 0;
        int is1 = h.step == 1 && memcmp(payload, gen1, n) == 0;
        CHECK(is0 || is1, "newest replica (step %lld) is neither generation intact", (long long)h.step);
        CHECK(crc32c(0, payload, h.length) == h.crc, "checksum");
        printf("  holder serves generation %lld after the kill\n", (long long)h.step);
        free(gen1);
    }
    free(payload);
    payload = NULL;
    CHECK(replica_server_lookup(srv, 1, 0, &h, &payload) == REPLICA_OK && h.step == 0 && memcmp(payload, gen0, n) == 0,
          "generation 0 must stay intact and usable");
    free(payload);
    close(ready[0]);
    close(ready[1]);
    replica_server_stop(srv);
    free(gen0);
}

/* Before its first capture the engine has faulted in its own two buffers and had the holder
 * fault in its two slots (here in the same process: 4 x the payload), and says how long
 * that took; the first generation then replicates as usual. */
static void test_buffers_set_up_before_first_capture(void) {
    char err[256];
    ReplicaServer *srv = replica_server_start("127.0.0.1", 0, JOB, WORLD, 0 /* proc, as the targets say */, KEY, err, sizeof err);
    CHECK(srv != NULL, "%s", err);
    if (!srv) return;
    size_t n = 40u << 20; /* above glibc's largest mmap threshold: fresh pages, never reused heap */
    unsigned char *live = malloc(n);
    fill(live, n, 7);
    SnapRegion region = {live, n};
    ReplicaTarget target = {"127.0.0.1", replica_server_port(srv), 0};
    SnapshotConfig sc = {.job = JOB, .epoch = 0, .rank = 1, .world = WORLD, .regions = &region, .nregions = 1,
                         .targets = &target, .ntargets = 1, .timeout_ms = 5000, .key = KEY};
    size_t before = th_resident_bytes();
    Snapshot *s = snapshot_create(&sc, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) { free(live); replica_server_stop(srv); return; }
    SnapshotStats st = {0};
    double deadline = now_ms() + 10000;
    do {
        sleep_ms(5);
        snapshot_stats(s, &st);
    } while (st.warmup_ms == 0 && now_ms() < deadline);
    size_t grown = th_resident_bytes() - before;
    CHECK(st.warmup_ms > 0, "buffer set-up not finished within 10 s");
    CHECK(grown >= 4 * n - (4u << 20), "set-up grew the resident memory by %zu bytes, want about 4 x %zu", grown, n);
    snapshot_capture(s, 0);
    CHECK(snapshot_wait_previous(s, NULL) == 0, "generation 0 committed");
    CHECK(replica_equals(srv, 1, 0, &region, 1), "replica of generation 0 equals the live state");
    snapshot_destroy(s);
    free(live);
    replica_server_stop(srv);
}

/* An engine whose key is not the holder's replicates nothing: every generation fails to
 * commit (the job would recover), and the holder stores nothing. */
static void test_wrong_key_replicates_nothing(void) {
    char err[256], secret[REPLICA_SECRET_HEX_LEN + 1];
    unsigned char other[REPLICA_KEY_BYTES];
    CHECK(replica_secret_new(secret, sizeof secret) == 0 && replica_key_derive(secret, other) == 0, "another key");
    ReplicaServer *srv = replica_server_start("127.0.0.1", 0, JOB, WORLD, 0 /* proc, as the targets say */, KEY, err, sizeof err);
    CHECK(srv != NULL, "%s", err);
    if (!srv) return;
    size_t n = 1 << 20;
    unsigned char *live = malloc(n);
    fill(live, n, 3);
    SnapRegion region = {live, n};
    ReplicaTarget target = {"127.0.0.1", replica_server_port(srv), 0};
    SnapshotConfig sc = {.job = JOB, .rank = 1, .world = WORLD, .regions = &region, .nregions = 1,
                         .targets = &target, .ntargets = 1, .timeout_ms = 2000, .key = other};
    Snapshot *s = snapshot_create(&sc, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (s) {
        snapshot_capture(s, 0);
        CHECK(snapshot_wait_previous(s, NULL) == -1, "a generation replicated with the wrong key committed");
        CHECK(snapshot_committed(s) == -1, "committed %lld", (long long)snapshot_committed(s));
        snapshot_destroy(s);
    }
    SnapHeader h;
    void *p = NULL;
    CHECK(replica_server_lookup(srv, 1, -1, &h, &p) == REPLICA_NOT_FOUND, "the holder stored a generation");
    free(p);
    sc.key = NULL;
    CHECK(snapshot_create(&sc, err, sizeof err) == NULL, "holders without a key must be refused");
    free(live);
    replica_server_stop(srv);
}

/* Which block holds each generation of declared state (gen_block): the generations between two
 * snapshots share a block, every snapshot's successor starts the other one, and so a snapshot
 * is never in the block its successors write until the next snapshot. Checked against the
 * rule itself over the first generations, for several intervals. */
static void test_gen_block(void) {
    CHECK(gen_block(-1, 1) == 1 && gen_block(0, 1) == 0 && gen_block(1, 1) == 1 && gen_block(2, 1) == 0,
          "every step: gen & 1");
    CHECK(gen_block(-1, 3) == 1 && gen_block(0, 3) == 0 && gen_block(2, 3) == 0 && gen_block(3, 3) == 1 &&
          gen_block(5, 3) == 1 && gen_block(6, 3) == 0, "every 3 steps: floor(gen / 3) & 1");
    for (int every = 1; every <= 7; every++)
        for (int64_t k = -1; k < 60; k++) {
            int snap = (k + 1) % every == 0; /* -1 (the initial state) counts as one */
            int64_t next = k + every;      /* the next snapshot after a snapshot k */
            if (snap) {
                for (int64_t j = k + 1; j <= next; j++)
                    CHECK(gen_block(j, every) != gen_block(k, every), "every %d: generation %lld overwrites snapshot %lld",
                          every, (long long)j, (long long)k);
            } else {
                CHECK(gen_block(k + 1, every) == gen_block(k, every), "every %d: %lld -> %lld not in place", every,
                      (long long)k, (long long)k + 1);
            }
        }
    CHECK(gen_block(5, 0) == 1, "an interval below 1 counts as 1");
    CHECK(gen_block(-1, INT_MAX) == 1 && gen_block(0, INT_MAX) == 0 && gen_block(1000000, INT_MAX) == 0,
          "no snapshots: the first update out of place, the rest in place");
}

int main(void) {
    char secret[REPLICA_SECRET_HEX_LEN + 1];
    if (replica_secret_new(secret, sizeof secret) != 0 || replica_key_derive(secret, KEY) != 0) {
        printf("not ok - no channel key\n");
        return 1;
    }
    RUN_TEST(test_gen_block);
    RUN_TEST(test_gen_own_state);
    RUN_TEST(test_replica_equals_live_state);
    RUN_TEST(test_local_part_not_replicated);
    RUN_TEST(test_wait_protects_generation);
    RUN_TEST(test_rank_killed_mid_replication);
    RUN_TEST(test_buffers_set_up_before_first_capture);
    RUN_TEST(test_wrong_key_replicates_nothing);
    TEST_MAIN_END();
}
