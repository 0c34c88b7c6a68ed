/* test_replica.c — the replication channel on 127.0.0.1: generations and max_step, refused
 * PUTs (payload checksum, other job, broken header), a sender dying or stalling mid-payload,
 * concurrent PUTs and GETs without torn reads, lookup == GET, stored-memory corruption,
 * bounded client calls, reconnecting, and a prompt stop with transfers in flight; the
 * same-machine PULL (used when allowed, refused when the source cannot be trusted or read,
 * the PUT tests again with pulling); RESERVE faulting in an owner's slots ahead of its first
 * PUT without giving up a held generation. Prints the PUT/GET throughput for a 32 MiB payload
 * (not asserted). */
#include "checksum.h"
#include "harness.h"
#include "replica.h"
#include "rng.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define JOB "testjob"
#define WORLD 8
#define TIMEOUT_MS 10000

/* Whether client connections let the holder pull payloads from this process's memory:
 * the PUT tests run once over TCP and once pulled. */
static int ALLOW_PULL;

/* ------------------------------------------------------------------------------------- */
/* helpers                                                                                */
/* ------------------------------------------------------------------------------------- */

/* Deterministic payload of generation `step` of `rank`, so any reader can re-derive it. */
static unsigned char *make_payload(int rank, int64_t step, size_t len) {
    unsigned char *p = malloc(len ? len : 1);
    uint64_t seed = rng_hash4(0xD00D, (uint64_t)rank, (uint64_t)step, len);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = rng_mix64(seed + i);
        memcpy(p + i, &w, 8);
    }
    for (; i < len; i++) p[i] = (unsigned char)rng_mix64(seed + i);
    return p;
}

static SnapHeader make_header(const char *job, int rank, int64_t step, const void *payload, size_t len) {
    SnapHeader h;
    memset(&h, 0, sizeof h);
    h.magic = SNAP_MAGIC;
    h.version = SNAP_VERSION;
    snprintf(h.job, sizeof h.job, "%s", job);
    h.epoch = 1;
    h.rank = rank;
    h.world = WORLD;
    h.step = step;
    h.length = len;
    h.crc = crc32c(0, payload, len);
    snap_header_seal(&h);
    return h;
}

static ReplicaServer *start_server(void) {
    char err[256] = "";
    ReplicaServer *s = replica_server_start("127.0.0.1", 0, JOB, err, sizeof err);
    CHECK(s != NULL, "server start: %s", err);
    if (s) CHECK(replica_server_port(s) > 0, "port %d", replica_server_port(s));
    return s;
}

static ReplicaConn *connect_to(ReplicaServer *s) {
    char err[256] = "";
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(s), TIMEOUT_MS, ALLOW_PULL, err, sizeof err);
    CHECK(c != NULL, "connect: %s", err);
    return c;
}

/* PUTs generation `step` of rank (payload derived from (rank, step, len)). */
static replica_status put_gen(ReplicaConn *c, int rank, int64_t step, size_t len) {
    unsigned char *p = make_payload(rank, step, len);
    SnapHeader h = make_header(JOB, rank, step, p, len);
    replica_status st = replica_put(c, &h, p, TIMEOUT_MS);
    free(p);
    return st;
}

/* GETs and checks the result is exactly generation `want_step` of rank with length len. */
static void expect_gen(ReplicaConn *c, int rank, int64_t max_step, int64_t want_step, size_t len) {
    SnapHeader h;
    void *got = NULL;
    replica_status st = replica_get(c, JOB, rank, max_step, &h, &got, TIMEOUT_MS);
    CHECK(st == REPLICA_OK, "GET rank %d max_step %lld: %s", rank, (long long)max_step, replica_status_str(st));
    if (st != REPLICA_OK) return;
    CHECK(h.step == want_step, "GET max_step %lld: step %lld, want %lld", (long long)max_step, (long long)h.step,
          (long long)want_step);
    CHECK(h.rank == rank && h.length == len, "rank %d length %llu", h.rank, (unsigned long long)h.length);
    CHECK(snap_header_check(&h) == NULL, "returned header fails its check");
    unsigned char *want = make_payload(rank, want_step, len);
    CHECK(h.length == len && memcmp(got, want, len) == 0, "payload of step %lld differs", (long long)want_step);
    free(want);
    free(got);
}

static void expect_status(ReplicaConn *c, const char *job, int rank, int64_t max_step, replica_status want) {
    SnapHeader h;
    void *got = (void *)1;
    replica_status st = replica_get(c, job, rank, max_step, &h, &got, TIMEOUT_MS);
    CHECK(st == want, "GET %s rank %d max_step %lld: %s, want %s", job, rank, (long long)max_step,
          replica_status_str(st), replica_status_str(want));
    CHECK(got == NULL || st == REPLICA_OK, "payload must be NULL on failure");
    if (st == REPLICA_OK) free(got);
}

/* A plain blocking socket to the server, for speaking the protocol by hand. */
static int raw_connect(ReplicaServer *s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)replica_server_port(s))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 5}; /* bound every raw read/write */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static int raw_send(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Sends 'P' + header + the first `part` bytes of the payload. */
static int raw_put_partial(int fd, const SnapHeader *h, const void *payload, size_t part) {
    char type = REPLICA_REQ_PUT;
    if (raw_send(fd, &type, 1) != 0 || raw_send(fd, h, sizeof *h) != 0) return -1;
    return raw_send(fd, payload, part);
}

/* Reads the holder's 4-byte verdict, or returns 1 (not a status) on EOF/timeout. */
static int32_t raw_status(int fd) {
    int32_t st = 1;
    size_t got = 0;
    while (got < sizeof st) {
        ssize_t r = recv(fd, (char *)&st + got, sizeof st - got, 0);
        if (r <= 0) return 1;
        got += (size_t)r;
    }
    return st;
}

/* ------------------------------------------------------------------------------------- */
/* tests                                                                                  */
/* ------------------------------------------------------------------------------------- */

static void test_header_seal_and_check(void) {
    CHECK(sizeof(SnapHeader) == 88, "sizeof %zu", sizeof(SnapHeader));
    unsigned char p[100];
    memset(p, 7, sizeof p);
    SnapHeader h = make_header(JOB, 2, 5, p, sizeof p);
    CHECK(snap_header_check(&h) == NULL, "sealed header: %s", snap_header_check(&h));
    SnapHeader t = h;
    t.step++;
    CHECK(snap_header_check(&t) != NULL, "a changed field must fail the header checksum");
    t = h;
    t.job[30] ^= 1; /* bytes after the NUL are covered too */
    CHECK(snap_header_check(&t) != NULL, "a changed job byte must fail");
    t = h;
    t.magic = 0;
    snap_header_seal(&t);
    CHECK(snap_header_check(&t) != NULL, "bad magic");
    t = h;
    t.rank = WORLD;
    snap_header_seal(&t);
    CHECK(snap_header_check(&t) != NULL, "rank >= world");
    t = h;
    t.length = 1ULL << 40;
    snap_header_seal(&t);
    CHECK(snap_header_check(&t) != NULL, "absurd length");
    t = h;
    memset(t.job, 'x', sizeof t.job);
    snap_header_seal(&t);
    CHECK(snap_header_check(&t) != NULL, "unterminated job");
    CHECK(snap_header_check(NULL) != NULL, "NULL header");
}

static void test_generations_and_max_step(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len[3] = {3u << 20, (3u << 20) + 17, (2u << 20) + 5};
    for (int g = 0; g < 3 && c; g++) {
        replica_status st = put_gen(c, 3, g, len[g]);
        CHECK(st == REPLICA_OK, "PUT gen %d: %s", g, replica_status_str(st));
    }
    if (c) {
        expect_gen(c, 3, -1, 2, len[2]);
        expect_gen(c, 3, 7, 2, len[2]);
        expect_gen(c, 3, 2, 2, len[2]);
        expect_gen(c, 3, 1, 1, len[1]);
        expect_status(c, JOB, 3, 0, REPLICA_NOT_FOUND); /* only two generations are kept */
        expect_gen(c, 3, -1, 2, len[2]);                /* the connection is still in step */
    }
    /* lookup answers exactly like GET */
    int64_t steps[4] = {-1, 1, 0, 2};
    for (int i = 0; i < 4; i++) {
        SnapHeader hl, hg;
        void *pl = NULL, *pg = NULL;
        replica_status sl = replica_server_lookup(s, 3, steps[i], &hl, &pl);
        replica_status sg = c ? replica_get(c, JOB, 3, steps[i], &hg, &pg, TIMEOUT_MS) : REPLICA_IO;
        CHECK(sl == sg, "max_step %lld: lookup %s, GET %s", (long long)steps[i], replica_status_str(sl),
              replica_status_str(sg));
        if (sl == REPLICA_OK && sg == REPLICA_OK) {
            CHECK(memcmp(&hl, &hg, sizeof hl) == 0, "headers differ");
            CHECK(memcmp(pl, pg, hl.length) == 0, "payloads differ");
        }
        free(pl);
        free(pg);
    }
    SnapHeader h;
    void *p = (void *)1;
    CHECK(replica_server_lookup(s, 9, -1, &h, &p) == REPLICA_NOT_FOUND && p == NULL, "lookup of unknown rank");
    replica_close(c);
    replica_server_stop(s);
}

static void test_bad_payload_refused(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 1u << 20;
    if (c) {
        CHECK(put_gen(c, 3, 1, len) == REPLICA_OK, "PUT gen 1");
        CHECK(put_gen(c, 3, 2, len) == REPLICA_OK, "PUT gen 2");
        unsigned char *p = make_payload(3, 3, len);
        SnapHeader h = make_header(JOB, 3, 3, p, len);
        p[len / 3] ^= 0x10; /* one flipped byte relative to header.crc */
        replica_status st = replica_put(c, &h, p, TIMEOUT_MS);
        CHECK(st == REPLICA_REFUSED, "corrupted PUT: %s", replica_status_str(st));
        free(p);
        expect_gen(c, 3, -1, 2, len); /* previous generation intact; the conn reconnected */
        /* The refused PUT was received into gen 1's slot, which is now empty. */
        expect_status(c, JOB, 3, 1, REPLICA_NOT_FOUND);
        CHECK(put_gen(c, 3, 3, len) == REPLICA_OK, "good PUT after a refused one");
        expect_gen(c, 3, -1, 3, len);
        expect_gen(c, 3, 2, 2, len);
    }
    replica_close(c);
    replica_server_stop(s);
}

static void test_sender_dies_mid_transfer(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 4u << 20;
    if (c) {
        CHECK(put_gen(c, 3, 1, len) == REPLICA_OK, "PUT gen 1");
        CHECK(put_gen(c, 3, 2, len) == REPLICA_OK, "PUT gen 2");
        unsigned char *p = make_payload(3, 3, len);
        SnapHeader h = make_header(JOB, 3, 3, p, len);

        /* stalled sender: while half a payload sits in a slot, GET serves the newest complete one */
        int fd = raw_connect(s);
        CHECK(fd >= 0 && raw_put_partial(fd, &h, p, len / 2) == 0, "raw partial PUT");
        expect_gen(c, 3, -1, 2, len);
        SnapHeader hl;
        void *pl = NULL;
        CHECK(replica_server_lookup(s, 3, -1, &hl, &pl) == REPLICA_OK && hl.step == 2, "lookup during a PUT");
        free(pl);
        if (fd >= 0) close(fd); /* the sender dies */

        expect_gen(c, 3, -1, 2, len);
        /* and a later complete PUT works (it may wait until the holder noticed the drop) */
        replica_status st = replica_put(c, &h, p, TIMEOUT_MS);
        CHECK(st == REPLICA_OK, "PUT after a dead sender: %s", replica_status_str(st));
        expect_gen(c, 3, -1, 3, len);
        expect_gen(c, 3, 2, 2, len);
        free(p);
    }
    replica_close(c);
    replica_server_stop(s);
}

static void test_refusals_and_not_found(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t big = 16u << 20;
    if (c) {
        CHECK(put_gen(c, 2, 4, 1000) == REPLICA_OK, "PUT rank 2");

        /* other job: refused from its header, before the 16 MiB payload is pushed */
        unsigned char *p = make_payload(2, 5, big);
        SnapHeader h = make_header("otherjob", 2, 5, p, big);
        double t0 = now_ms();
        replica_status st = replica_put(c, &h, p, TIMEOUT_MS);
        CHECK(st == REPLICA_REFUSED, "wrong job: %s", replica_status_str(st));
        printf("# wrong-job PUT of 16 MiB refused in %.1f ms\n", now_ms() - t0);
        free(p);

        expect_status(c, JOB, 7, -1, REPLICA_NOT_FOUND);        /* unknown rank */
        expect_status(c, "otherjob", 2, -1, REPLICA_NOT_FOUND); /* unknown job */
        expect_status(c, JOB, -1, -1, REPLICA_NOT_FOUND);
        expect_gen(c, 2, -1, 4, 1000);
    }

    /* hand-made headers: broken header checksum, absurd length, rank beyond the limit */
    for (int kind = 0; kind < 3; kind++) {
        unsigned char q[64] = {0};
        SnapHeader h = make_header(JOB, 1, 1, q, sizeof q);
        if (kind == 0) h.step = 2; /* not resealed */
        if (kind == 1) { h.length = 1ULL << 40; snap_header_seal(&h); }
        if (kind == 2) { h.rank = (1 << 20) + 1; h.world = (1 << 20) + 2; snap_header_seal(&h); }
        int fd = raw_connect(s);
        CHECK(fd >= 0 && raw_put_partial(fd, &h, q, sizeof q) == 0, "raw PUT %d", kind);
        if (fd >= 0) {
            int32_t st = raw_status(fd);
            CHECK(st == REPLICA_REFUSED, "bad header kind %d: status %d", kind, st);
            close(fd);
        }
    }
    /* an unknown request type closes the connection without harm */
    int fd = raw_connect(s);
    if (fd >= 0) {
        CHECK(raw_send(fd, "Z", 1) == 0, "send junk");
        char b;
        CHECK(recv(fd, &b, 1, 0) == 0, "holder closes on an unknown request");
        close(fd);
    }
    if (c) expect_gen(c, 2, -1, 4, 1000);
    replica_close(c);
    replica_server_stop(s);
}

static void test_get_detects_memory_corruption(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 100000;
    if (c) {
        CHECK(put_gen(c, 1, 1, len) == REPLICA_OK, "PUT gen 1");
        CHECK(put_gen(c, 1, 2, len) == REPLICA_OK, "PUT gen 2");
        CHECK(replica_server_debug_flip(s, 1, 2, 777) == 0, "flip in gen 2");
        expect_gen(c, 1, -1, 1, len); /* newest fails re-verification: the older one is served */
        expect_gen(c, 1, 2, 1, len);  /* gen 2 was dropped when it failed */
        CHECK(replica_server_debug_flip(s, 1, 1, 0) == 0, "flip in gen 1");
        SnapHeader h;
        void *p = (void *)1;
        CHECK(replica_server_lookup(s, 1, -1, &h, &p) == REPLICA_CORRUPT && p == NULL, "lookup: all corrupt");
        expect_status(c, JOB, 1, -1, REPLICA_NOT_FOUND); /* the corrupt generations were dropped */
        CHECK(replica_server_debug_flip(s, 1, 1, 0) == -1, "nothing left to flip");
        CHECK(put_gen(c, 1, 3, len) == REPLICA_OK, "PUT after corruption");
        expect_gen(c, 1, -1, 3, len);
    }
    replica_close(c);
    replica_server_stop(s);
}

/* ---- a PUT never overwrites a slot a GET is still sending ---- */

typedef struct {
    ReplicaServer *s;
    size_t len;
    replica_status st;
    volatile int finished;
    pthread_mutex_t mu;
} PutJob;

static void *put_gen3(void *arg) {
    PutJob *j = arg;
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(j->s), TIMEOUT_MS, ALLOW_PULL, NULL, 0);
    replica_status st = c ? put_gen(c, 0, 3, j->len) : REPLICA_IO;
    replica_close(c);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    j->finished = 1;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static int raw_recv(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void test_put_waits_for_a_reader_of_its_slot(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 32u << 20; /* far more than the socket buffers hold */
    PutJob j = {.s = s, .len = len, .mu = PTHREAD_MUTEX_INITIALIZER};
    int fd = -1;
    if (c) {
        CHECK(put_gen(c, 0, 1, len) == REPLICA_OK, "PUT gen 1");
        CHECK(put_gen(c, 0, 2, len) == REPLICA_OK, "PUT gen 2");
        /* a slow reader of gen 1: the holder's send blocks with gen 1's slot pinned */
        fd = raw_connect(s);
        unsigned char req[1 + 40 + 4 + 8] = {REPLICA_REQ_GET};
        snprintf((char *)req + 1, 40, "%s", JOB);
        int32_t rank = 0;
        int64_t max_step = 1;
        memcpy(req + 41, &rank, 4);
        memcpy(req + 45, &max_step, 8);
        CHECK(fd >= 0 && raw_send(fd, req, sizeof req) == 0, "raw GET");
        sleep_ms(100);
    }
    pthread_t t;
    int started = c && fd >= 0 && pthread_create(&t, NULL, put_gen3, &j) == 0;
    if (started) {
        sleep_ms(300);
        pthread_mutex_lock(&j.mu);
        int early = j.finished;
        pthread_mutex_unlock(&j.mu);
        CHECK(!early, "gen 3 must wait for the reader of the slot it replaces");
        int32_t st = 1;
        SnapHeader h;
        unsigned char *got = malloc(len);
        CHECK(raw_recv(fd, &st, 4) == 0 && st == REPLICA_OK, "raw GET status %d", st);
        CHECK(raw_recv(fd, &h, sizeof h) == 0 && h.step == 1 && h.length == len, "raw GET header");
        CHECK(raw_recv(fd, got, len) == 0, "raw GET payload");
        unsigned char *want = make_payload(0, 1, len);
        CHECK(memcmp(got, want, len) == 0 && crc32c(0, got, len) == h.crc, "slow reader got gen 1 untorn");
        free(want);
        free(got);
        pthread_join(t, NULL);
        CHECK(j.st == REPLICA_OK, "gen 3 after the reader finished: %s", replica_status_str(j.st));
        expect_gen(c, 0, -1, 3, len);
        expect_gen(c, 0, 2, 2, len);
    }
    if (fd >= 0) close(fd);
    replica_close(c);
    replica_server_stop(s);
}

/* ---- concurrent PUTs and GETs ---- */

#define CC_RANKS 4
#define CC_GENS 40

typedef struct {
    ReplicaServer *s;
    int rank;
    int failures;
    volatile int *writers_left;
    pthread_mutex_t *mu;
} WriterArg;

typedef struct {
    ReplicaServer *s;
    int id;
    int ok, not_found, bad;
    volatile int *writers_left;
    pthread_mutex_t *mu;
} ReaderArg;

static size_t cc_len(int rank, int64_t gen) { return (256u << 10) + (size_t)rank * 4099 + (size_t)gen * 131; }

static void *cc_writer(void *arg) {
    WriterArg *w = arg;
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(w->s), TIMEOUT_MS, ALLOW_PULL, NULL, 0);
    for (int g = 0; g < CC_GENS && c; g++)
        if (put_gen(c, w->rank, g, cc_len(w->rank, g)) != REPLICA_OK) w->failures++;
    if (!c) w->failures++;
    replica_close(c);
    pthread_mutex_lock(w->mu);
    (*w->writers_left)--;
    pthread_mutex_unlock(w->mu);
    return NULL;
}

static int cc_writers_left(ReaderArg *r) {
    pthread_mutex_lock(r->mu);
    int n = *r->writers_left;
    pthread_mutex_unlock(r->mu);
    return n;
}

static void *cc_reader(void *arg) {
    ReaderArg *r = arg;
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(r->s), TIMEOUT_MS, ALLOW_PULL, NULL, 0);
    if (!c) {
        r->bad++;
        return NULL;
    }
    double deadline = now_ms() + 60000;
    for (uint64_t i = 0; cc_writers_left(r) > 0 && now_ms() < deadline; i++) {
        int rank = (int)(rng_hash4(11, (uint64_t)r->id, i, 0) % CC_RANKS);
        /* mostly the newest, sometimes an older step so readers also pin the older slot */
        int64_t max_step = (i % 3) ? -1 : (int64_t)(rng_hash4(12, (uint64_t)r->id, i, 0) % CC_GENS);
        SnapHeader h;
        void *p = NULL;
        replica_status st = (i % 4 == 3) ? replica_server_lookup(r->s, rank, max_step, &h, &p)
                                         : replica_get(c, JOB, rank, max_step, &h, &p, TIMEOUT_MS);
        if (st == REPLICA_NOT_FOUND) {
            r->not_found++;
            continue;
        }
        if (st != REPLICA_OK) {
            r->bad++;
            continue;
        }
        int good = h.rank == rank && h.step >= 0 && h.step < CC_GENS && (max_step < 0 || h.step <= max_step) &&
                   h.length == cc_len(rank, h.step) && crc32c(0, p, h.length) == h.crc;
        if (good) {
            unsigned char *want = make_payload(rank, h.step, h.length);
            good = memcmp(p, want, h.length) == 0;
            free(want);
        }
        if (good) r->ok++;
        else r->bad++;
        free(p);
    }
    replica_close(c);
    return NULL;
}

static void test_concurrent_puts_and_gets(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    volatile int writers_left = CC_RANKS;
    WriterArg w[CC_RANKS];
    ReaderArg r[2];
    pthread_t wt[CC_RANKS], rt[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (ReaderArg){.s = s, .id = i, .writers_left = &writers_left, .mu = &mu};
        pthread_create(&rt[i], NULL, cc_reader, &r[i]);
    }
    for (int i = 0; i < CC_RANKS; i++) {
        w[i] = (WriterArg){.s = s, .rank = i, .writers_left = &writers_left, .mu = &mu};
        pthread_create(&wt[i], NULL, cc_writer, &w[i]);
    }
    for (int i = 0; i < CC_RANKS; i++) {
        pthread_join(wt[i], NULL);
        CHECK(w[i].failures == 0, "writer %d: %d failed PUTs", i, w[i].failures);
    }
    int ok = 0;
    for (int i = 0; i < 2; i++) {
        pthread_join(rt[i], NULL);
        CHECK(r[i].bad == 0, "reader %d: %d bad results", i, r[i].bad);
        ok += r[i].ok;
    }
    printf("# concurrent: %d verified reads, %d+%d not found\n", ok, r[0].not_found, r[1].not_found);
    CHECK(ok > 0, "readers saw no generation at all");
    ReplicaConn *c = connect_to(s);
    for (int i = 0; i < CC_RANKS && c; i++) {
        expect_gen(c, i, -1, CC_GENS - 1, cc_len(i, CC_GENS - 1));
        expect_gen(c, i, CC_GENS - 2, CC_GENS - 2, cc_len(i, CC_GENS - 2));
    }
    replica_close(c);
    replica_server_stop(s);
}

/* ---- same-machine PULL ---- */

/* A PULL request by hand: the PullSource layout of replica.c's protocol comment. */
typedef struct {
    char boot_id[40];
    uint64_t pidns;
    int64_t pid;
    uint64_t addr;
} RawPullSource;

static RawPullSource this_process(const void *addr) {
    RawPullSource src;
    memset(&src, 0, sizeof src);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(src.boot_id, sizeof src.boot_id, f)) src.boot_id[strcspn(src.boot_id, "\n")] = 0;
        fclose(f);
    }
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) src.pidns = st.st_ino;
    src.pid = getpid();
    src.addr = (uint64_t)(uintptr_t)addr;
    return src;
}

/* Whether this kernel lets a process read another's memory at all (a seccomp profile may
 * forbid process_vm_readv): reading our own memory tells. Without it the holder must answer
 * NO_PULL and replication falls back to TCP, which the pulled tests then check instead. */
static int can_pull(void) {
    char src[16] = "pull probe", dst[16] = "";
    struct iovec local = {dst, sizeof dst}, remote = {src, sizeof src};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof dst;
}

static int32_t raw_pull(ReplicaServer *s, const SnapHeader *h, const RawPullSource *src) {
    int fd = raw_connect(s);
    if (fd < 0) return 1;
    char type = REPLICA_REQ_PULL;
    int32_t st = 1;
    if (raw_send(fd, &type, 1) == 0 && raw_send(fd, h, sizeof *h) == 0 && raw_send(fd, src, sizeof *src) == 0)
        st = raw_status(fd);
    close(fd);
    return st;
}

static void test_pull_used_on_this_machine(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ALLOW_PULL = 1;
    ReplicaConn *c = connect_to(s);
    size_t len = (3u << 20) + 123; /* not a multiple of the pull chunk */
    if (c) {
        CHECK(put_gen(c, 1, 1, len) == REPLICA_OK, "pulled PUT");
        if (can_pull()) CHECK(replica_last_put_pulled(c), "a holder on this machine pulls");
        else printf("# process_vm_readv is not permitted here: checked the TCP fallback only\n");
        expect_gen(c, 1, -1, 1, len);
        SnapHeader h;
        void *got = NULL;
        unsigned char *want = make_payload(1, 1, len);
        CHECK(replica_server_lookup(s, 1, -1, &h, &got) == REPLICA_OK && got && memcmp(got, want, len) == 0,
              "pulled bytes equal the sender's");
        free(got);
        free(want);
    }
    replica_close(c);
    ALLOW_PULL = 0;
    c = connect_to(s);
    if (c) {
        CHECK(put_gen(c, 1, 2, len) == REPLICA_OK && !replica_last_put_pulled(c), "allow_pull 0: TCP");
        expect_gen(c, 1, -1, 2, len);
    }
    replica_close(c);
    replica_server_stop(s);
}

/* The holder pulls only from a process it can name, and keeps only bytes that match the CRC:
 * otherwise it answers NO_PULL (the sender then PUTs) and the slot stays empty. */
static void test_pull_refused_when_unsafe(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    size_t len = 1u << 20;
    unsigned char *p = make_payload(2, 5, len);
    SnapHeader h = make_header(JOB, 2, 5, p, len);
    RawPullSource src = this_process(p);
    int32_t first = raw_pull(s, &h, &src);
    CHECK(first == (can_pull() ? REPLICA_OK : REPLICA_NO_PULL), "pull from this process: %d", first);

    h = make_header(JOB, 2, 6, p, len);
    RawPullSource other = src;
    snprintf(other.boot_id, sizeof other.boot_id, "another-machine");
    CHECK(raw_pull(s, &h, &other) == REPLICA_NO_PULL, "another machine's boot id");
    other = src;
    other.pidns ^= 1;
    CHECK(raw_pull(s, &h, &other) == REPLICA_NO_PULL, "another pid namespace");
    other = src;
    other.pid = 0x3fffffff; /* no such process */
    CHECK(raw_pull(s, &h, &other) == REPLICA_NO_PULL, "a process that does not exist");
    other = src;
    other.addr = 8; /* not mapped */
    CHECK(raw_pull(s, &h, &other) == REPLICA_NO_PULL, "an unmapped address");
    p[len / 2] ^= 4; /* the bytes no longer match header.crc */
    CHECK(raw_pull(s, &h, &src) == REPLICA_NO_PULL, "bytes that fail the checksum");
    p[len / 2] ^= 4;
    SnapHeader bad = h;
    snprintf(bad.job, sizeof bad.job, "otherjob");
    snap_header_seal(&bad);
    CHECK(raw_pull(s, &bad, &src) == REPLICA_REFUSED, "another job's header");

    ReplicaConn *c = connect_to(s);
    if (c && first == REPLICA_OK) {
        expect_gen(c, 2, -1, 5, len); /* none of the failed pulls left anything behind */
        expect_status(c, JOB, 2, 4, REPLICA_NOT_FOUND);
    } else if (c) {
        expect_status(c, JOB, 2, -1, REPLICA_NOT_FOUND);
    }
    replica_close(c);
    free(p);
    replica_server_stop(s);
}

/* ---- bounds ---- */

/* RESERVE faults in both slots of an owner up front (the holder's resident memory grows by
 * 2 x length at once, not during the first PUTs), never gives up a held generation, and
 * refuses a header of another job. */
static void test_reserve_prepares_slots_and_keeps_generations(void) {
    ReplicaServer *s = start_server();
    ReplicaConn *c = s ? connect_to(s) : NULL;
    if (!c) { replica_server_stop(s); return; }
    /* above glibc's largest dynamic mmap threshold (32 MiB): the slots are fresh pages, never
     * heap memory an earlier test already touched */
    const size_t small = 100000, big = 40u << 20;
    CHECK(put_gen(c, 1, 5, small) == REPLICA_OK, "PUT rank 1 step 5");

    SnapHeader h = make_header(JOB, 2, -1, "", 0);
    h.length = big;
    snap_header_seal(&h);
    size_t before = th_resident_bytes();
    replica_status st = replica_reserve(c, &h, TIMEOUT_MS);
    size_t grown = th_resident_bytes() - before;
    CHECK(st == REPLICA_OK, "RESERVE rank 2: %s", replica_status_str(st));
    CHECK(grown >= 2 * big - (1u << 20), "RESERVE of 2 x %zu bytes grew the resident memory by only %zu", big, grown);
    CHECK(put_gen(c, 2, 0, big) == REPLICA_OK, "PUT after RESERVE");
    expect_gen(c, 2, -1, 0, big);

    /* rank 1 holds step 5 in one slot: a RESERVE for it must leave that generation alone */
    h = make_header(JOB, 1, -1, "", 0);
    h.length = big;
    snap_header_seal(&h);
    st = replica_reserve(c, &h, TIMEOUT_MS);
    CHECK(st == REPLICA_OK, "RESERVE rank 1: %s", replica_status_str(st));
    expect_gen(c, 1, -1, 5, small);

    h = make_header("otherjob", 3, -1, "", 0);
    st = replica_reserve(c, &h, TIMEOUT_MS);
    CHECK(st == REPLICA_REFUSED, "RESERVE of another job: %s, want refused", replica_status_str(st));
    replica_close(c);
    replica_server_stop(s);
}

static void test_client_calls_are_bounded(void) {
    /* a "holder" that accepts and then never answers */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t alen = sizeof a;
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0, "mute listener");
    getsockname(lfd, (struct sockaddr *)&a, &alen);
    int port = ntohs(a.sin_port);
    ReplicaConn *c = replica_connect("127.0.0.1", port, 1000, ALLOW_PULL, NULL, 0);
    CHECK(c != NULL, "connect to the mute listener");
    if (c) {
        SnapHeader h;
        void *p = NULL;
        double t0 = now_ms();
        replica_status st = replica_get(c, JOB, 0, -1, &h, &p, 200);
        double dt = now_ms() - t0;
        CHECK(st == REPLICA_IO && dt < 1500, "GET from a mute holder: %s after %.0f ms", replica_status_str(st), dt);
        /* a PUT far bigger than the socket buffers, to a holder that never reads */
        size_t len = 64u << 20;
        unsigned char *big = calloc(1, len);
        h = make_header(JOB, 0, 0, big, len);
        t0 = now_ms();
        st = replica_put(c, &h, big, 300);
        dt = now_ms() - t0;
        CHECK(st == REPLICA_IO && dt < 1500, "PUT to a mute holder: %s after %.0f ms", replica_status_str(st), dt);
        free(big);
        replica_close(c);
    }
    close(lfd);
    char err[256] = "";
    double t0 = now_ms();
    c = replica_connect("127.0.0.1", port, 500, ALLOW_PULL, err, sizeof err); /* nobody listens any more */
    CHECK(c == NULL && err[0] && now_ms() - t0 < 1500, "connect to a closed port fails promptly");
    replica_close(c);
}

static void test_reconnects_after_holder_restart(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    int port = replica_server_port(s);
    ReplicaConn *c = connect_to(s);
    if (c) CHECK(put_gen(c, 0, 1, 5000) == REPLICA_OK, "PUT before restart");
    replica_server_stop(s);
    char err[256] = "";
    s = replica_server_start("127.0.0.1", port, JOB, err, sizeof err);
    if (!s) {
        printf("# port %d not reusable (%s): restart test skipped\n", port, err);
        replica_close(c);
        return;
    }
    if (c) {
        expect_status(c, JOB, 0, -1, REPLICA_NOT_FOUND); /* a fresh holder holds nothing */
        CHECK(put_gen(c, 0, 2, 5000) == REPLICA_OK, "PUT over the same ReplicaConn after restart");
        expect_gen(c, 0, -1, 2, 5000);
    }
    replica_close(c);
    replica_server_stop(s);
}

static void test_stop_with_transfers_in_flight(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    size_t len = 32u << 20;
    unsigned char *p = make_payload(0, 5, len);
    /* three partial PUTs for one rank: two fill both slots, the third waits for a slot */
    int fds[3];
    for (int i = 0; i < 3; i++) {
        SnapHeader h = make_header(JOB, 0, 5 + i, p, len);
        fds[i] = raw_connect(s);
        CHECK(fds[i] >= 0 && raw_put_partial(fds[i], &h, p, i < 2 ? len / 4 : 100) == 0, "partial PUT %d", i);
    }
    ReplicaConn *idle = connect_to(s); /* and one idle client connection */
    sleep_ms(100);                     /* let the holder reach its blocking points */
    double t0 = now_ms();
    replica_server_stop(s);
    double dt = now_ms() - t0;
    printf("# replica_server_stop with 3 transfers in flight: %.1f ms\n", dt);
    CHECK(dt < 2000, "stop took %.0f ms", dt);
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0) close(fds[i]);
    replica_close(idle);
    free(p);
}

/* ---- throughput (printed, not asserted) ---- */

static void test_put_throughput(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 32u << 20;
    unsigned char *p = make_payload(0, 0, len);
    double best_put = 1e9, best_get = 1e9;
    for (int rep = 0; rep < 6 && c; rep++) {
        SnapHeader h = make_header(JOB, 0, rep, p, len);
        double t0 = now_ms();
        replica_status st = replica_put(c, &h, p, TIMEOUT_MS);
        double t1 = now_ms();
        CHECK(st == REPLICA_OK, "PUT %d: %s", rep, replica_status_str(st));
        void *got = NULL;
        st = replica_get(c, JOB, 0, -1, &h, &got, TIMEOUT_MS);
        double t2 = now_ms();
        CHECK(st == REPLICA_OK && h.step == rep, "GET %d: %s", rep, replica_status_str(st));
        free(got);
        if (t1 - t0 < best_put) best_put = t1 - t0;
        if (t2 - t1 < best_get) best_get = t2 - t1;
    }
    printf("# 32 MiB over loopback: PUT (%s) %.2f GB/s (%.1f ms), GET %.2f GB/s (%.1f ms), best of 6\n",
           ALLOW_PULL ? "pulled" : "TCP", len / best_put / 1e6, best_put, len / best_get / 1e6, best_get);
    free(p);
    replica_close(c);
    replica_server_stop(s);
}

/* The tests whose PUTs matter, again with the holder pulling. */
#define PULLED(fn)                         \
    static void fn##_pulled(void) {        \
        ALLOW_PULL = 1;                    \
        fn();                              \
        ALLOW_PULL = 0;                    \
    }
PULLED(test_generations_and_max_step)
PULLED(test_bad_payload_refused)
PULLED(test_sender_dies_mid_transfer)
PULLED(test_concurrent_puts_and_gets)
PULLED(test_put_throughput)

int main(void) {
    RUN_TEST(test_header_seal_and_check);
    RUN_TEST(test_generations_and_max_step);
    RUN_TEST(test_bad_payload_refused);
    RUN_TEST(test_sender_dies_mid_transfer);
    RUN_TEST(test_refusals_and_not_found);
    RUN_TEST(test_get_detects_memory_corruption);
    RUN_TEST(test_put_waits_for_a_reader_of_its_slot);
    RUN_TEST(test_concurrent_puts_and_gets);
    RUN_TEST(test_reserve_prepares_slots_and_keeps_generations);
    RUN_TEST(test_client_calls_are_bounded);
    RUN_TEST(test_reconnects_after_holder_restart);
    RUN_TEST(test_stop_with_transfers_in_flight);
    RUN_TEST(test_put_throughput);
    RUN_TEST(test_pull_used_on_this_machine);
    RUN_TEST(test_pull_refused_when_unsafe);
    RUN_TEST(test_generations_and_max_step_pulled);
    RUN_TEST(test_bad_payload_refused_pulled);
    RUN_TEST(test_sender_dies_mid_transfer_pulled);
    RUN_TEST(test_concurrent_puts_and_gets_pulled);
    RUN_TEST(test_put_throughput_pulled);
    TEST_MAIN_END();
}
