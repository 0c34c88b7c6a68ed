/* gen_corpus.c — writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/NAME/) with
 * DeadPool's own writers, so every seed is a file or message the code really produces, plus
 * a few near misses. `make fuzz-corpus` rebuilds and reruns it; the output is checked in
 * (a few KB in all). Usage: gen_corpus DIR */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checksum.h"
#include "data.h"
#include "generation.h"
#include "model.h"
#include "modelfile.h"
#include "protocol.h"
#include "recovery.h"
#include "comm_auth.h"
#include "replica.h"

static const char *out_dir;

static void die(const char *what, const char *err) {
    fprintf(stderr, "gen_corpus: %s: %s\n", what, err);
    exit(1);
}

static void put(const char *harness, const char *name, const void *data, size_t len) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", out_dir, harness);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die(dir, strerror(errno));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) die(path, "write failed");
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) die(path, "read failed");
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The fuzz_modelfile harness's fixed shape. */
static const GPT2Config SMALL = {.max_seq_len = 4, .vocab_size = 5, .padded_vocab_size = 8,
                                 .num_layers = 2, .num_heads = 2, .channels = 4};

static void modelfiles(const char *tmp) {
    char path[600], err[512];
    size_t n = gpt2_num_params(&SMALL), len;
    float *p = calloc(n, sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)((int)(i % 17) - 8) / 64.0f;
    snprintf(path, sizeof path, "%s/model.bin", tmp);
    if (modelfile_write(path, &SMALL, p, err, sizeof err) != 0) die(path, err);
    unsigned char *b = slurp(path, &len);
    put("modelfile", "valid", b, len);
    put("modelfile", "truncated", b, len - 6);
    put("modelfile", "header_only", b, 1024);
    memcpy(b + 1024 + 40, &(float){0.0f / 0.0f}, 4);
    put("modelfile", "nan", b, len);
    int32_t *h = (int32_t *)b;
    h[1] = 2;
    put("modelfile", "version2", b, 1024);
    free(b);
    free(p);
}

static void datafiles(const char *tmp) {
    char path[600], err[512];
    uint16_t tok[24];
    size_t len;
    for (int i = 0; i < 24; i++) tok[i] = (uint16_t)(i * 11 % 256);
    snprintf(path, sizeof path, "%s/shard.bin", tmp);
    if (data_write_shard(path, tok, 24, err, sizeof err) != 0) die(path, err);
    unsigned char *b = slurp(path, &len);
    put("data", "shard", b, len);
    put("data", "shard_truncated", b, len - 3);
    tok[5] = 50000;
    if (data_write_shard(path, tok, 24, err, sizeof err) != 0) die(path, err);
    free(b);
    b = slurp(path, &len);
    put("data", "shard_gpt2_token", b, len);
    free(b);
    const char *text = "To be, or not to be, that is the question.\n";
    put("data", "text", text, strlen(text));
    put("data", "text_utf8", "caf\xc3\xa9\n", 6);
}

static size_t generation(unsigned char *buf, int nregions) {
    static unsigned char a[40], c[24];
    for (size_t i = 0; i < sizeof a; i++) a[i] = (unsigned char)i;
    dp_region r[2] = {{.id = 1, .kind = DP_SHARDED, .ptr = a, .len = sizeof a},
                      {.id = 7, .kind = DP_IDENTICAL, .ptr = c, .len = sizeof c}};
    const char extra[] = "cursor";
    size_t head = gen_head_bytes(nregions, sizeof extra);
    gen_head_write(buf, 1337, 42, r, nregions, extra, sizeof extra);
    size_t len = head;
    for (int i = 0; i < nregions; i++) {
        memcpy(buf + len, r[i].ptr, r[i].len);
        len += r[i].len;
    }
    return len;
}

static void checkpoints(const char *tmp) {
    unsigned char gen[512];
    char err[512], path[700];
    size_t len = generation(gen, 2), flen;
    put("checkpoint", "generation", gen, len);
    put("checkpoint", "generation_empty", gen, generation(gen, 0));
    len = generation(gen, 2);
    SnapRegion reg = {.ptr = gen, .len = len};
    if (checkpoint_write_live(tmp, "job-1", 3, 1, 2, 41, &reg, 1, err, sizeof err) != 0) die("checkpoint", err);
    checkpoint_path(path, sizeof path, tmp, 41, "rank_00001.state");
    unsigned char *b = slurp(path, &flen);
    put("checkpoint", "state_rank1", b, flen);
    SnapHeader *h = (SnapHeader *)b;
    h->rank = 0;
    snap_header_seal(h);
    put("checkpoint", "state_rank0", b, flen);
    put("checkpoint", "state_truncated", b, flen - 10);
    b[flen - 1] ^= 1;
    put("checkpoint", "state_bad_crc", b, flen);
    free(b);
    /* MANIFESTs: fuzz_checkpoint's checkpoint holds DONE ("0\n") beside them. */
    char manifest[256];
    int m = snprintf(manifest, sizeof manifest, "world 1\n%08x 2 DONE\n", crc32c(0, "0\n", 2));
    put("checkpoint", "manifest_done", manifest, (size_t)m);
    m = snprintf(manifest, sizeof manifest, "world 2\n%08x %zu rank_00000.state\n%08x 2 DONE\n", 0x1234u, flen, 0x5678u);
    put("checkpoint", "manifest_states", manifest, (size_t)m);
}

static void decisions(void) {
    static Decision d;
    static char text[DECISION_TEXT_MAX];
    memset(&d, 0, sizeof d);
    d.epoch = 2;
    d.world = 4;
    d.rollback = 17;
    for (int r = 0; r < 4; r++) d.procs[r] = 100 + r;
    d.procs[2] = 104;
    d.nfailed = 1;
    d.failed[0] = (FailedRank){.rank = 2, .old_proc = 102, .spare_proc = 104, .kind = "crash"};
    d.t_fail_ms = 1764590000000;
    d.t_detect_ms = 1764590000120;
    d.t_decide_ms = 1764590000125;
    if (decision_format(&d, text, sizeof text) != 0) die("decision", "format");
    put("decision", "swap", text, strlen(text));
    memset(&d, 0, sizeof d);
    d.epoch = 1;
    d.world = 1;
    d.rollback = -1;
    d.procs[0] = 5;
    if (decision_format(&d, text, sizeof text) != 0) die("decision", "format");
    put("decision", "rebuild", text, strlen(text));
    put("decision", "truncated", text, strlen(text) - 1);
    Holder hs[2] = {{.proc = 123, .host = "127.0.0.1", .port = 4000}, {.proc = 456, .host = "::1", .port = 5}};
    if (holders_format(hs, 2, text, sizeof text) != 0) die("holders", "format");
    put("decision", "holders", text, strlen(text));
    Report rep = {.kind = REPORT_JOIN_FAILED, .epoch = 3, .rank = 2, .step = -1, .t_wall_ms = 1764590000125,
                  .phase = JOIN_RESTORE, .text = "rank 2's state: every copy failed its check"};
    if (report_format(&rep, text, sizeof text) != 0) die("report", "format");
    put("decision", "report_join_failed", text, strlen(text));
    rep = (Report){.kind = REPORT_COMM_FAILURE, .epoch = 1, .rank = 0, .step = 40, .t_wall_ms = 1, .text = "peer closed"};
    if (report_format(&rep, text, sizeof text) != 0) die("report", "format");
    put("decision", "report_comm_failure", text, strlen(text));
}

/* The control plane's values (fuzz_protocol), each as its writer formats it. */
static void protocols(void) {
    static char text[PERSIST_REQ_TEXT_MAX];
    static PersistRequest pr;
    FaultRecord f = {.kind = "kill", .rank = 3, .wall_ms = 1764590000125};
    if (fault_record_format(&f, text, sizeof text) != 0) die("fault record", "format");
    put("protocol", "fault_record", text, strlen(text));
    pr.epoch = 2;
    pr.step = 17;
    pr.writer = 0;
    pr.nfailed = 2;
    pr.failed[0] = 3;
    pr.failed[1] = 1;
    if (persist_request_format(&pr, text, sizeof text) != 0) die("persist request", "format");
    put("protocol", "persist_request", text, strlen(text));
    JoinTiming t = {.restore_ms = 12.25, .rebuild_ms = 3, .resnapshot_ms = 0.125, .resumed_wall_ms = 1764590000125, .warm = 1};
    if (join_timing_format(&t, text, sizeof text) != 0) die("join timing", "format");
    put("protocol", "join_timing", text, strlen(text));
    JoinStats js = {.ctl_round_trips = 4, .store_round_trips = 3, .rendezvous_ms = 20.5, .barrier_ms = 1.25, .wait_ms = 10,
                    .connect_ms = 2.5, .entered_wall_ms = 1764590000100, .dialed = 1, .accepted = 15};
    if (join_stats_format(&js, text, sizeof text) != 0) die("join stats", "format");
    put("protocol", "join_stats", text, strlen(text));
    ExitRecord e = {.how = EXITED_DEPARTED, .wall_ms = 1764590000125};
    if (exit_record_format(&e, text, sizeof text) != 0) die("exit record", "format");
    put("protocol", "exit_record", text, strlen(text));
    LauncherId l = {.host = "node-1", .pid = 4242};
    if (launcher_id_format(&l, text, sizeof text) != 0) die("launcher id", "format");
    put("protocol", "launcher_id", text, strlen(text));
    LeaseValue lv = {.holder = "machine0", .token = 3};
    if (lease_value_format(&lv, text, sizeof text) != 0) die("lease", "format");
    put("protocol", "lease", text, strlen(text));
    Endpoint ep = {.host = "127.0.0.1", .port = 40000};
    if (endpoint_format(&ep, text, sizeof text) != 0) die("endpoint", "format");
    put("protocol", "endpoint", text, strlen(text));
    HeldGen h[2] = {{0, 17, 2}, {3, -1, 2}};
    if (held_format(h, 2, text, sizeof text) != 0) die("held", "format");
    put("protocol", "held", text, strlen(text));
    InventoryEntry inv[4] = {{149, 0}, {149, 1}, {149, 3}, {99, 2}};
    if (inventory_format(inv, 4, text, sizeof text) != 0) die("inventory", "format");
    put("protocol", "inventory", text, strlen(text));
    put("protocol", "state", "stopping", 8);
    put("protocol", "integer", "-3", 2);
}

/* Replica streams: flags byte (fuzz_replica.c), then requests. */
static size_t req_header(unsigned char *out, char type, int rank, int world, int64_t step, const void *payload,
                         uint64_t len) {
    SnapHeader h;
    memset(&h, 0, sizeof h);
    h.magic = SNAP_MAGIC;
    h.version = SNAP_VERSION;
    snprintf(h.job, sizeof h.job, "fuzz-job");
    h.epoch = 1;
    h.rank = rank;
    h.world = world;
    h.step = step;
    h.length = len;
    h.crc = payload ? crc32c(0, payload, len) : 0;
    snap_header_seal(&h);
    out[0] = (unsigned char)type;
    memcpy(out + 1, &h, sizeof h);
    size_t n = 1 + sizeof h;
    if (type == REPLICA_REQ_PUT && payload) {
        memcpy(out + n, payload, len);
        n += len;
    }
    if (type == REPLICA_REQ_PULL) {
        memset(out + n, 0, 72); /* PullSource: the harness points it at itself (flag 8) */
        n += 72;
    }
    return n;
}

static size_t req_get(unsigned char *out, int32_t rank, int64_t max_step) {
    memset(out, 0, 53);
    out[0] = REPLICA_REQ_GET;
    snprintf((char *)out + 1, 40, "fuzz-job");
    memcpy(out + 41, &rank, 4);
    memcpy(out + 45, &max_step, 8);
    return 53;
}

static void replica_streams(void) {
    unsigned char s[2048], payload[64];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (unsigned char)(i * 3);
    size_t n = 0;
    s[n++] = 0x5f; /* authenticated, every fix-up (fuzz_replica.c) */
    n += req_header(s + n, REPLICA_REQ_RESERVE, 0, 4, 0, NULL, sizeof payload);
    n += req_header(s + n, REPLICA_REQ_PUT, 0, 4, 5, payload, sizeof payload);
    n += req_header(s + n, REPLICA_REQ_PUT, 0, 4, 6, payload, sizeof payload);
    n += req_get(s + n, 0, -1);
    n += req_get(s + n, 0, 5);
    n += req_get(s + n, 1, -1);
    put("replica", "reserve_put_get", s, n);
    n = 0;
    s[n++] = 0x5f;
    n += req_header(s + n, REPLICA_REQ_PULL, 1, 4, 3, NULL, sizeof payload);
    n += req_get(s + n, 1, -1);
    put("replica", "pull_get", s, n);
    n = 0;
    s[n++] = 0x51; /* authenticated, job fixed, payload CRC as given, payload tag right */
    n += req_header(s + n, REPLICA_REQ_PUT, 0, 4, 5, payload, sizeof payload);
    s[n - 1] ^= 0xff; /* payload no longer matches its CRC: refused, connection kept */
    n += req_get(s + n, 0, -1);
    put("replica", "put_bad_crc", s, n);
    n = 0;
    s[n++] = 0x1f; /* every fix-up but the payload's tag: 16 zero bytes (altered on the way) */
    n += req_header(s + n, REPLICA_REQ_PUT, 0, 4, 5, payload, sizeof payload);
    memset(s + n, 0, 16);
    n += 16;
    n += req_get(s + n, 0, -1);
    put("replica", "put_bad_payload_tag", s, n);
    n = 0;
    s[n++] = 0x90; /* a correct handshake meaning another holder (relayed): closed */
    n += req_get(s + n, 0, -1);
    put("replica", "relay", s, n);
    n = 0;
    s[n++] = 0x7f; /* the last request's tag is wrong */
    n += req_header(s + n, REPLICA_REQ_PUT, 2, 4, 5, payload, sizeof payload);
    n += req_get(s + n, 2, -1);
    put("replica", "bad_tag", s, n);
    n = 0;
    s[n++] = 0x10;
    n += req_get(s + n, 0, -1);
    s[n++] = 'X'; /* unknown request: the holder closes */
    put("replica", "get_unknown", s, n);
    n = 0;
    s[n++] = 0x00; /* no handshake: 64 bytes where the answer to the hello belongs */
    for (int i = 0; i < 64; i++) s[n++] = (unsigned char)i;
    put("replica", "bad_handshake", s, n);
}

/* Data-plane streams (fuzz_comm.c): flags, handshake choices, then frame records. */
static size_t comm_handshake(unsigned char *s, unsigned char flags, unsigned size, unsigned d, unsigned a) {
    size_t n = 0;
    s[n++] = flags;
    if (!(flags & 1)) { /* a stranger's 72 bytes first */
        memcpy(s + n, "DPC1", 4);
        for (int i = 4; i < COMM_HS_PROOF_BYTES; i++) s[4 + n + i - 4] = (unsigned char)(i * 13);
        n += COMM_HS_PROOF_BYTES;
    }
    s[n++] = (unsigned char)(size - 1);
    s[n++] = (unsigned char)d;
    s[n++] = (unsigned char)a;
    s[n++] = 9; /* prefix length */
    s[n++] = 0; /* no flip */
    s[n++] = 0;
    memcpy(s + n, "job/e/12/", 9);
    return n + 9;
}

static size_t comm_frame_rec(unsigned char *s, unsigned char type, uint64_t slot, unsigned len, unsigned flip, unsigned bound) {
    size_t n = 0;
    s[n++] = 1; /* sealed */
    s[n++] = type;
    memcpy(s + n, &slot, 8);
    n += 8;
    s[n++] = (unsigned char)len, s[n++] = (unsigned char)(len >> 8);
    s[n++] = (unsigned char)flip, s[n++] = (unsigned char)(flip >> 8);
    s[n++] = (unsigned char)bound, s[n++] = (unsigned char)(bound >> 8);
    s[n++] = 100; /* split */
    if (type == COMM_FRAME_DATA)
        for (unsigned i = 0; i < len; i++) s[n++] = (unsigned char)(i * 31 + 7);
    return n;
}

static void comm_streams(void) {
    static unsigned char s[8192];
    size_t n = comm_handshake(s, 0x01, 4, 3, 1);
    n += comm_frame_rec(s + n, COMM_FRAME_RECV_READY, 0x0700000000000001ull, 64, 0, 4096);
    n += comm_frame_rec(s + n, COMM_FRAME_DATA, 0x0700000000000001ull, 1000, 0, 4096);
    n += comm_frame_rec(s + n, COMM_FRAME_DATA, 5, 0, 0, 4096);
    put("comm", "frames", s, n);
    n = comm_handshake(s, 0x03, 2, 1, 0);
    n += comm_frame_rec(s + n, COMM_FRAME_DATA, 1, 300, 8 * 40 + 17, 4096); /* a payload bit flipped */
    put("comm", "flipped_payload", s, n);
    n = comm_handshake(s, 0x01, 2, 1, 0);
    n += comm_frame_rec(s + n, COMM_FRAME_DATA, 1, 300, 0, 100); /* over the bound */
    put("comm", "over_bound", s, n);
    n = comm_handshake(s, 0x00, 3, 2, 0);
    s[n++] = 0; /* a raw head */
    for (int i = 0; i < COMM_FRAME_HEAD_BYTES; i++) s[n++] = (unsigned char)i;
    put("comm", "stranger", s, n);
    n = comm_handshake(s, 0x01, 3, 0, 0); /* no pair */
    put("comm", "bad_ranks", s, n);
}

/* Handshake answers, as fuzz_replica_handshake.c reads them: flags, [position, mask], [Nh],
 * k and k chunk sizes, then Nc (the harness makes the proof) or the raw bytes. */
static void handshake_seed(const char *name, unsigned char flags, const unsigned char *plan, size_t k,
                           size_t extra) {
    unsigned char s[512];
    size_t n = 0;
    s[n++] = flags;
    if (flags & 0x04) {
        s[n++] = 40; /* a byte of the client's proof */
        s[n++] = 0x80;
    }
    if (flags & 0x20)
        for (int i = 0; i < 32; i++) s[n++] = (unsigned char)(0xc0 + i);
    s[n++] = (unsigned char)k;
    if (k) memcpy(s + n, plan, k);
    n += k;
    for (int i = 0; i < 32; i++) s[n++] = (unsigned char)(i * 7 + 1); /* Nc, or raw bytes */
    if ((flags & 3) == 0)
        for (int i = 0; i < 32; i++) s[n++] = (unsigned char)(i * 13);
    if (extra) n += req_get(s + n, 0, -1); /* a first request sent right behind the answer */
    put("replica_handshake", name, s, n);
}

static void replica_handshakes(void) {
    unsigned char ones[64], plan[8];
    memset(ones, 1, sizeof ones);
    handshake_seed("valid", 0x01, NULL, 0, 0);
    handshake_seed("valid_byte_by_byte", 0x41, ones, sizeof ones, 0);
    plan[0] = 30, plan[1] = 50;
    handshake_seed("valid_then_request", 0x01, plan, 2, 1);
    handshake_seed("valid_then_request_at_most_want", 0x41, plan, 2, 1);
    handshake_seed("valid_long_identity", 0x31, NULL, 0, 0);
    handshake_seed("relay_another_holder", 0x02, NULL, 0, 0);
    handshake_seed("another_jobs_key", 0x03, NULL, 0, 0);
    handshake_seed("proof_altered", 0x05, NULL, 0, 0);
    plan[0] = 33, plan[1] = 0;
    handshake_seed("closed_midway", 0x01, plan, 2, 0);
    handshake_seed("raw_bytes", 0x08, NULL, 0, 0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus DIR\n");
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) die(out_dir, strerror(errno));
    char tmp[] = "/tmp/dp_gen_corpus_XXXXXX";
    if (!mkdtemp(tmp)) die("mkdtemp", strerror(errno));
    modelfiles(tmp);
    datafiles(tmp);
    checkpoints(tmp);
    decisions();
    protocols();
    replica_streams();
    comm_streams();
    replica_handshakes();
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "gen_corpus: could not remove %s\n", tmp);
    printf("seed corpora written to %s\n", out_dir);
    return 0;
}
