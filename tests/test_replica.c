/* test_replica.c — the replication channel on 127.0.0.1: the job key and the authenticated
 * channel (requests without the handshake, with another job's key, with a wrong or replayed
 * MAC get nothing; a holder without the key gets nothing from a client), RESERVE and PUT bounded
 * by the job's ranks and the holder's budget, PULL only from the requesting process;
 * generations and max_step, refused
 * PUTs (payload checksum, other job, broken header), a sender dying or stalling mid-payload,
 * concurrent PUTs and GETs without torn reads, lookup == GET, stored-memory corruption,
 * bounded client calls, reconnecting, and a prompt stop with transfers in flight; the
 * same-machine PULL (used when allowed, refused when the source cannot be trusted or read,
 * the PUT tests again with pulling); RESERVE faulting in an owner's slots ahead of its first
 * PUT without giving up a held generation; a process squatting a dead holder's port that
 * relays to another holder and forges the payload (CRC fixed up), and payloads altered on the
 * way with their CRC fixed up, are refused. Prints the PUT/GET throughput for a 32 MiB payload
 * (not asserted). */
#include "checksum.h"
#include "harness.h"
#include "replica.h"
#include "rng.h"
#include "util.h"

#include <arpa/inet.h>
#include <grp.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define JOB "testjob"
#define WORLD 8
#define TIMEOUT_MS 10000
#define PROC 7 /* the job's process id of every holder the tests start (unless said otherwise) */

/* The job's channel key (main derives it from a fresh secret), and another job's. */
static unsigned char KEY[REPLICA_KEY_BYTES], OTHER_KEY[REPLICA_KEY_BYTES];

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
    ReplicaServer *s = replica_server_start("127.0.0.1", 0, JOB, WORLD, PROC, KEY, err, sizeof err);
    CHECK(s != NULL, "server start: %s", err);
    if (s) CHECK(replica_server_port(s) > 0, "port %d", replica_server_port(s));
    return s;
}

static ReplicaConn *connect_to(ReplicaServer *s) {
    char err[256] = "";
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(s), PROC, TIMEOUT_MS, ALLOW_PULL, KEY, err,
                                     sizeof err);
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

/* A plain blocking TCP socket to port on 127.0.0.1, every read/write bounded. -1 on failure. */
static int raw_tcp(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
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

/* Bytes the peer sends until it closes (or 5 s of silence). */
static size_t raw_drain(int fd) {
    char buf[4096];
    size_t total = 0;
    ssize_t r;
    while ((r = recv(fd, buf, sizeof buf, 0)) > 0) total += (size_t)r;
    return total;
}

/* The protocol spoken by hand, as replica.c's comment specifies it (written here again from
 * that text with libsodium, so the tests check the specification, not only the code). */
typedef struct {
    int fd;
    unsigned char ks[crypto_auth_KEYBYTES];
    uint64_t tx, rx;
} RawConn;

/* MAC(key, label || nh || nc || id): id is the holder's identity, "PROC@HOST:PORT". */
static void raw_label(unsigned char out[crypto_auth_BYTES], const unsigned char *key, const char *label,
                      const unsigned char *nh, const unsigned char *nc, const char *id) {
    unsigned char in[64 + 64 + 300];
    size_t n = strlen(label), k = strlen(id);
    memcpy(in, label, n);
    memcpy(in + n, nh, 32);
    memcpy(in + n + 32, nc, 32);
    memcpy(in + n + 64, id, k);
    crypto_auth(out, in, n + 64 + k, key);
}

/* The identity of holder process proc listening on 127.0.0.1:port. */
static const char *holder_id(char id[300], long proc, int port) {
    snprintf(id, 300, "%ld@127.0.0.1:%d", proc, port);
    return id;
}

/* Connects to port and runs the client's handshake with `key`, meaning holder `id`. 0
 * (authenticated), -1 (the holder closed: our proof was refused), -2 (the holder's proof is
 * wrong), -3 (no connection). */
static int raw_open_as(int port, const unsigned char *key, const char *id, RawConn *rc) {
    memset(rc, 0, sizeof *rc);
    rc->fd = raw_tcp(port);
    if (rc->fd < 0) return -3;
    unsigned char hello[36], answer[64], proof[32], want[32];
    if (raw_recv(rc->fd, hello, sizeof hello) != 0 || memcmp(hello, "DPR2", 4) != 0) return -1;
    randombytes_buf(answer, 32);
    raw_label(answer + 32, key, "DPrepl02 client", hello + 4, answer, id);
    if (raw_send(rc->fd, answer, sizeof answer) != 0 || raw_recv(rc->fd, proof, sizeof proof) != 0) return -1;
    raw_label(want, key, "DPrepl02 holder", hello + 4, answer, id);
    if (crypto_verify_32(proof, want) != 0) return -2;
    raw_label(rc->ks, key, "DPrepl02 session", hello + 4, answer, id);
    return 0;
}

/* The same, meaning holder PROC on that port, as the job's processes connect to it. */
static int raw_open_key(int port, const unsigned char *key, RawConn *rc) {
    char id[300];
    return raw_open_as(port, key, holder_id(id, PROC, port), rc);
}

static int raw_open(ReplicaServer *s, RawConn *rc) { return raw_open_key(replica_server_port(s), KEY, rc); }

static void raw_close(RawConn *rc) {
    if (rc->fd >= 0) close(rc->fd);
    rc->fd = -1;
}

/* The tag of message msg sent as number seq in direction dir. */
static void raw_tag(const RawConn *rc, char dir, uint64_t seq, const void *msg, size_t len, unsigned char tag[32]) {
    unsigned char in[9 + 256];
    in[0] = (unsigned char)dir;
    memcpy(in + 1, &seq, 8);
    memcpy(in + 9, msg, len);
    crypto_auth(tag, in, 9 + len, rc->ks);
}

/* The Poly1305 tag of a payload that follows message number seq sent in direction dir, with
 * the one-time key replica.c's comment specifies. */
static void raw_payload_tag(const unsigned char *ks, char dir, uint64_t seq, const void *payload, size_t len,
                            unsigned char tag[crypto_onetimeauth_BYTES]) {
    unsigned char otk[crypto_onetimeauth_KEYBYTES];
    crypto_kdf_derive_from_key(otk, sizeof otk, seq, dir == 'C' ? "DPpayC02" : "DPpayH02", ks);
    crypto_onetimeauth(tag, payload, len, otk);
}

/* Sends a request (type byte first) and its tag. */
static int raw_request(RawConn *rc, const void *msg, size_t len) {
    unsigned char tag[32];
    raw_tag(rc, 'C', rc->tx++, msg, len, tag);
    return raw_send(rc->fd, msg, len) != 0 || raw_send(rc->fd, tag, sizeof tag) != 0 ? -1 : 0;
}

/* Reads a reply: the status (and, when it is OK and h is given, a header), then its tag. The
 * status, or 1 (not a status) on EOF, timeout or a wrong tag. */
static int32_t raw_reply(RawConn *rc, SnapHeader *h) {
    unsigned char msg[4 + sizeof(SnapHeader)], tag[32], want[32];
    int32_t st;
    size_t len = 4;
    if (raw_recv(rc->fd, msg, 4) != 0) return 1;
    memcpy(&st, msg, 4);
    if (st == REPLICA_OK && h) {
        if (raw_recv(rc->fd, msg + 4, sizeof *h) != 0) return 1;
        memcpy(h, msg + 4, sizeof *h);
        len += sizeof *h;
    }
    if (raw_recv(rc->fd, tag, sizeof tag) != 0) return 1;
    raw_tag(rc, 'H', rc->rx++, msg, len, want);
    return crypto_verify_32(tag, want) == 0 ? st : 1;
}

static int32_t raw_status(RawConn *rc) { return raw_reply(rc, NULL); }

/* Sends 'P' + header (tagged) + the first `part` bytes of the payload, and the payload's tag
 * when that is all of it. */
static int raw_put_partial(RawConn *rc, const SnapHeader *h, const void *payload, size_t part) {
    unsigned char req[1 + sizeof *h] = {REPLICA_REQ_PUT}, tag[crypto_onetimeauth_BYTES];
    memcpy(req + 1, h, sizeof *h);
    if (raw_request(rc, req, sizeof req) != 0) return -1;
    if (raw_send(rc->fd, payload, part) != 0) return -1;
    if (part != h->length) return 0;
    raw_payload_tag(rc->ks, 'C', rc->tx - 1, payload, part, tag);
    return raw_send(rc->fd, tag, sizeof tag);
}

/* A GET request by hand. */
static int raw_get(RawConn *rc, int32_t rank, int64_t max_step) {
    unsigned char req[1 + 40 + 4 + 8] = {REPLICA_REQ_GET};
    snprintf((char *)req + 1, 40, "%s", JOB);
    memcpy(req + 41, &rank, 4);
    memcpy(req + 45, &max_step, 8);
    return raw_request(rc, req, sizeof req);
}

/* ------------------------------------------------------------------------------------- */
/* tests                                                                                  */
/* ------------------------------------------------------------------------------------- */

/* The secret is 64 hex digits of fresh randomness; the key is a function of it alone. */
static void test_key_derivation(void) {
    char a[REPLICA_SECRET_HEX_LEN + 1], b[REPLICA_SECRET_HEX_LEN + 1], tiny[10];
    unsigned char ka[REPLICA_KEY_BYTES], ka2[REPLICA_KEY_BYTES], kb[REPLICA_KEY_BYTES];
    CHECK(replica_secret_new(a, sizeof a) == 0 && replica_secret_new(b, sizeof b) == 0, "secrets");
    CHECK(strlen(a) == REPLICA_SECRET_HEX_LEN && strspn(a, "0123456789abcdef") == REPLICA_SECRET_HEX_LEN, "hex '%s'", a);
    CHECK(strcmp(a, b) != 0, "two secrets are equal");
    CHECK(replica_secret_new(tiny, sizeof tiny) == -1, "a secret into a short buffer");
    CHECK(replica_key_derive(a, ka) == 0 && replica_key_derive(a, ka2) == 0 && replica_key_derive(b, kb) == 0, "keys");
    CHECK(memcmp(ka, ka2, sizeof ka) == 0 && memcmp(ka, kb, sizeof ka) != 0, "a key depends on its secret alone");
    CHECK(memcmp(ka, a, sizeof ka) != 0, "the key is not the secret");
    a[63] = 'g';
    CHECK(replica_key_derive(a, ka) == -1, "a secret with a non-hex digit");
    a[63] = 0;
    CHECK(replica_key_derive(a, ka) == -1, "a short secret");
    CHECK(replica_key_derive("", ka) == -1 && replica_key_derive(NULL, ka) == -1, "no secret");
}

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

/* replica_get_into: a payload that fits lands in the caller's buffer, one that does not in a
 * fresh one; both verified, the buffer untouched past the payload. */
typedef struct {
    void *buf;
    size_t cap;
} Place;

static void *place_in(void *arg, uint64_t length) {
    Place *p = arg;
    return length <= p->cap ? p->buf : NULL;
}

static void test_get_into_a_callers_buffer(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = (1u << 20) + 3;
    CHECK(c && put_gen(c, 2, 5, len) == REPLICA_OK, "PUT");
    unsigned char *want = make_payload(2, 5, len);
    size_t caps[3] = {len + 100, len, len - 1};
    for (int i = 0; i < 3 && c; i++) {
        unsigned char *buf = malloc(len + 100);
        memset(buf, 0xAB, len + 100);
        SnapHeader h;
        void *got = NULL;
        Place pl = {buf, caps[i]};
        replica_status st = replica_get_into(c, JOB, 2, -1, &h, place_in, &pl, &got, TIMEOUT_MS);
        CHECK(st == REPLICA_OK, "GET into a buffer of %zu bytes: %s", caps[i], replica_status_str(st));
        if (st == REPLICA_OK) {
            CHECK((got == buf) == (caps[i] >= len), "cap %zu: payload %s the caller's buffer", caps[i],
                  got == buf ? "in" : "not in");
            CHECK(h.length == len && memcmp(got, want, len) == 0, "cap %zu: payload differs", caps[i]);
            if (got == buf) CHECK(buf[len] == 0xAB, "written past the payload");
            if (got != buf) free(got);
        }
        free(buf);
    }
    free(want);
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
        RawConn rc;
        CHECK(raw_open(s, &rc) == 0 && raw_put_partial(&rc, &h, p, len / 2) == 0, "raw partial PUT");
        expect_gen(c, 3, -1, 2, len);
        SnapHeader hl;
        void *pl = NULL;
        CHECK(replica_server_lookup(s, 3, -1, &hl, &pl) == REPLICA_OK && hl.step == 2, "lookup during a PUT");
        free(pl);
        raw_close(&rc); /* the sender dies */

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

    /* hand-made headers (authenticated): broken header checksum, absurd length, a rank beyond
     * the job's world (saying a larger world), the job's world but a rank at its end */
    for (int kind = 0; kind < 4; kind++) {
        unsigned char q[64] = {0};
        SnapHeader h = make_header(JOB, 1, 1, q, sizeof q);
        if (kind == 0) h.step = 2; /* not resealed */
        if (kind == 1) { h.length = 1ULL << 40; snap_header_seal(&h); }
        if (kind == 2) { h.rank = WORLD + 1; h.world = WORLD + 2; snap_header_seal(&h); }
        if (kind == 3) { h.rank = WORLD; snap_header_seal(&h); }
        RawConn rc;
        CHECK(raw_open(s, &rc) == 0 && raw_put_partial(&rc, &h, q, sizeof q) == 0, "raw PUT %d", kind);
        int32_t st = raw_status(&rc);
        CHECK(st == REPLICA_REFUSED, "bad header kind %d: status %d", kind, st);
        raw_close(&rc);
    }
    /* an unknown request type closes the connection without harm */
    RawConn rc;
    if (raw_open(s, &rc) == 0) {
        CHECK(raw_request(&rc, "Z", 1) == 0, "send junk");
        CHECK(raw_drain(rc.fd) == 0, "holder closes on an unknown request");
    }
    raw_close(&rc);
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
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(j->s), PROC, TIMEOUT_MS, ALLOW_PULL, KEY, NULL, 0);
    replica_status st = c ? put_gen(c, 0, 3, j->len) : REPLICA_IO;
    replica_close(c);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    j->finished = 1;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static void test_put_waits_for_a_reader_of_its_slot(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    ReplicaConn *c = connect_to(s);
    size_t len = 32u << 20; /* far more than the socket buffers hold */
    PutJob j = {.s = s, .len = len, .mu = PTHREAD_MUTEX_INITIALIZER};
    RawConn rc = {.fd = -1};
    if (c) {
        CHECK(put_gen(c, 0, 1, len) == REPLICA_OK, "PUT gen 1");
        CHECK(put_gen(c, 0, 2, len) == REPLICA_OK, "PUT gen 2");
        /* a slow reader of gen 1: the holder's send blocks with gen 1's slot pinned */
        CHECK(raw_open(s, &rc) == 0 && raw_get(&rc, 0, 1) == 0, "raw GET");
        sleep_ms(100);
    }
    pthread_t t;
    int started = c && rc.fd >= 0 && pthread_create(&t, NULL, put_gen3, &j) == 0;
    if (started) {
        sleep_ms(300);
        pthread_mutex_lock(&j.mu);
        int early = j.finished;
        pthread_mutex_unlock(&j.mu);
        CHECK(!early, "gen 3 must wait for the reader of the slot it replaces");
        SnapHeader h;
        unsigned char *got = malloc(len);
        int32_t st = raw_reply(&rc, &h);
        CHECK(st == REPLICA_OK, "raw GET status %d", st);
        CHECK(st == REPLICA_OK && h.step == 1 && h.length == len, "raw GET header");
        CHECK(raw_recv(rc.fd, got, len) == 0, "raw GET payload");
        unsigned char *want = make_payload(0, 1, len);
        CHECK(memcmp(got, want, len) == 0 && crc32c(0, got, len) == h.crc, "slow reader got gen 1 untorn");
        free(want);
        free(got);
        pthread_join(t, NULL);
        CHECK(j.st == REPLICA_OK, "gen 3 after the reader finished: %s", replica_status_str(j.st));
        expect_gen(c, 0, -1, 3, len);
        expect_gen(c, 0, 2, 2, len);
    }
    raw_close(&rc);
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
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(w->s), PROC, TIMEOUT_MS, ALLOW_PULL, KEY, NULL, 0);
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
    ReplicaConn *c = replica_connect("127.0.0.1", replica_server_port(r->s), PROC, TIMEOUT_MS, ALLOW_PULL, KEY, NULL, 0);
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
    uint32_t crc_known;
    uint32_t unused;
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
    src.crc_known = 1;
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

/* A PULL on an authenticated connection of this process: its status, 1 on failure; the
 * header the holder stored into *stored when given and the status is OK. */
static int32_t raw_pull_stored(ReplicaServer *s, const SnapHeader *h, const RawPullSource *src, SnapHeader *stored) {
    RawConn rc;
    int32_t st = 1;
    SnapHeader sink;
    unsigned char req[1 + sizeof *h + sizeof *src] = {REPLICA_REQ_PULL};
    memcpy(req + 1, h, sizeof *h);
    memcpy(req + 1 + sizeof *h, src, sizeof *src);
    if (raw_open(s, &rc) == 0 && raw_request(&rc, req, sizeof req) == 0) st = raw_reply(&rc, stored ? stored : &sink);
    raw_close(&rc);
    return st;
}

static int32_t raw_pull(ReplicaServer *s, const SnapHeader *h, const RawPullSource *src) {
    return raw_pull_stored(s, h, src, NULL);
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

/* rank 3's generation `step` with its CRC left out, as zero-copy state sends it; *crc gets
 * what it should be. */
static SnapHeader header_without_crc(int64_t step, const void *p, size_t len, uint32_t *crc) {
    SnapHeader h = make_header(JOB, 3, step, p, len);
    *crc = h.crc;
    h.crc = 0;
    snap_header_seal(&h);
    return h;
}

/* A generation whose CRC the owner left to its holder (zero-copy state): the holder computes
 * it over the bytes it pulls and answers with the header it stored; over TCP the client
 * computes it first. Either way the holder serves the bytes back verified, and a bit flipped
 * in its slot afterwards is caught when the replica is read. */
static void test_pull_computes_the_crc(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    size_t len = (2u << 20) + 77;
    for (int allow = 1; allow >= 0; allow--) {
        int64_t step = 5 - allow; /* 4 pulled, 5 over TCP */
        unsigned char *p = make_payload(3, step, len);
        uint32_t want;
        SnapHeader h = header_without_crc(step, p, len, &want);
        ALLOW_PULL = allow;
        ReplicaConn *c = connect_to(s);
        replica_status st = replica_put_summing(c, &h, p, TIMEOUT_MS);
        CHECK(st == REPLICA_OK, "summing PUT (allow_pull %d): %s", allow, replica_status_str(st));
        CHECK(h.crc == want && snap_header_check(&h) == NULL, "the CRC came back (allow_pull %d): %08x, want %08x",
              allow, h.crc, want);
        if (allow && can_pull()) CHECK(replica_last_put_pulled(c), "pulled");
        if (c) expect_gen(c, 3, -1, step, len);
        replica_close(c);
        free(p);
    }
    ALLOW_PULL = 0;
    /* by hand: a PULL without a CRC stores and answers the header with it */
    unsigned char *p = make_payload(3, 6, len);
    uint32_t want;
    SnapHeader h = header_without_crc(6, p, len, &want), stored;
    RawPullSource src = this_process(p);
    src.crc_known = 0;
    int32_t st = raw_pull_stored(s, &h, &src, &stored);
    if (can_pull()) {
        CHECK(st == REPLICA_OK && stored.crc == want && stored.step == 6 && snap_header_check(&stored) == NULL,
              "a PULL without a CRC: status %d, crc %08x, want %08x", st, stored.crc, want);
        CHECK(replica_server_debug_flip(s, 3, 6, len / 3) == 0, "flip a bit of the pulled slot");
        ReplicaConn *c = connect_to(s);
        if (c) expect_gen(c, 3, 6, 5, len); /* the flipped slot is not served; the older one is */
        replica_close(c);
    }
    free(p);
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

/* A fake holder on a loopback port: accepts one connection, runs the holder's side of the
 * handshake with `key` (or, with bad_proof, answers any client with a made-up proof), then
 * reads nothing more and never answers until the client goes away. */
typedef struct {
    int lfd, port;
    const unsigned char *key;
    long proc;           /* who it claims to be: holder process proc on its port */
    int bad_proof;
    /* When set, answers one GET with this generation, as an on-path attacker would pass it
     * on: the genuine header and payload tag, the payload altered with its CRC fixed up. */
    const SnapHeader *serve_h;
    const unsigned char *serve_payload;
    int client_proof_ok; /* the client's proof checked out */
    volatile int stop;   /* the test is done with it */
} FakeHolder;

static int fake_listen(FakeHolder *f) {
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t alen = sizeof a;
    if (bind(f->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->lfd, 4) != 0) return -1;
    getsockname(f->lfd, (struct sockaddr *)&a, &alen);
    f->port = ntohs(a.sin_port);
    return 0;
}

/* Changes 32 floats at p[0..128) and then the 4 bytes at p[128..132) so that the payload's
 * CRC32C is what it was: anyone can, the CRC is linear over GF(2). Solves for the bits to flip
 * from the effect of each single flip. len >= 132. */
static void forge_keeping_crc(unsigned char *p, size_t len) {
    uint32_t want = crc32c(0, p, len);
    for (int i = 0; i < 32; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        v = v * 2.0f + 1.0f;
        memcpy(p + 4 * i, &v, 4);
    }
    uint32_t base = crc32c(0, p, len), piv_v[32] = {0}, piv_m[32] = {0};
    for (int i = 0; i < 32; i++) { /* the column of bit i of the 4 bytes, reduced into the pivots */
        p[128 + i / 8] ^= (unsigned char)(1u << (i % 8));
        uint32_t v = crc32c(0, p, len) ^ base, m = 1u << i;
        p[128 + i / 8] ^= (unsigned char)(1u << (i % 8));
        for (int b = 31; b >= 0 && v; b--) {
            if (!((v >> b) & 1)) continue;
            if (!piv_v[b]) { piv_v[b] = v; piv_m[b] = m; break; }
            v ^= piv_v[b];
            m ^= piv_m[b];
        }
    }
    uint32_t v = base ^ want, m = 0;
    for (int b = 31; b >= 0; b--)
        if (((v >> b) & 1) && piv_v[b]) { v ^= piv_v[b]; m ^= piv_m[b]; }
    for (int i = 0; i < 32; i++)
        if ((m >> i) & 1) p[128 + i / 8] ^= (unsigned char)(1u << (i % 8));
}

/* The holder's side of one GET (the handshake done, with nonces nh, nc and identity id): the
 * request read, then f->serve_h with its genuine tags, and the payload forged. */
static void fake_serve_forged_get(FakeHolder *f, int fd, const unsigned char *nh, const unsigned char *nc,
                                  const char *id) {
    RawConn rc = {.fd = fd};
    unsigned char req[1 + 40 + 4 + 8 + 32], msg[4 + sizeof(SnapHeader)], tag[32], ptag[crypto_onetimeauth_BYTES];
    raw_label(rc.ks, f->key, "DPrepl02 session", nh, nc, id);
    if (raw_recv(fd, req, sizeof req) != 0) return;
    int32_t ok = REPLICA_OK;
    memcpy(msg, &ok, 4);
    memcpy(msg + 4, f->serve_h, sizeof(SnapHeader));
    raw_tag(&rc, 'H', 0, msg, sizeof msg, tag);
    size_t len = f->serve_h->length;
    raw_payload_tag(rc.ks, 'H', 0, f->serve_payload, len, ptag); /* the tag of the genuine bytes */
    unsigned char *forged = malloc(len);
    memcpy(forged, f->serve_payload, len);
    forge_keeping_crc(forged, len);
    raw_send(fd, msg, sizeof msg);
    raw_send(fd, tag, sizeof tag);
    raw_send(fd, forged, len);
    raw_send(fd, ptag, sizeof ptag);
    free(forged);
}

static void *fake_holder_main(void *arg) {
    FakeHolder *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned char hello[36] = "DPR2", answer[64], proof[32];
    char id[300];
    holder_id(id, f->proc, f->port);
    randombytes_buf(hello + 4, 32);
    if (raw_send(fd, hello, sizeof hello) == 0 && raw_recv(fd, answer, sizeof answer) == 0) {
        raw_label(proof, f->key, "DPrepl02 client", hello + 4, answer, id);
        f->client_proof_ok = crypto_verify_32(proof, answer + 32) == 0;
        raw_label(proof, f->key, "DPrepl02 holder", hello + 4, answer, id);
        if (f->bad_proof) randombytes_buf(proof, sizeof proof);
        raw_send(fd, proof, sizeof proof);
        if (f->serve_h) fake_serve_forged_get(f, fd, hello + 4, answer, id);
        for (int i = 0; i < 500 && !f->stop; i++) sleep_ms(10); /* mute from here on, reading nothing */
    }
    close(fd);
    return NULL;
}

static void test_client_calls_are_bounded(void) {
    /* a "holder" that accepts and then never answers: not even the handshake */
    FakeHolder f = {.key = KEY, .proc = PROC};
    CHECK(fake_listen(&f) == 0, "mute listener");
    double t0 = now_ms();
    char err[256] = "";
    ReplicaConn *c = replica_connect("127.0.0.1", f.port, PROC, 300, ALLOW_PULL, KEY, err, sizeof err);
    double dt = now_ms() - t0;
    CHECK(c == NULL && dt < 1500, "connect to a holder that never shakes hands: %s after %.0f ms", err, dt);
    replica_close(c);
    close(f.lfd);

    /* one that authenticates and then never answers a request */
    f = (FakeHolder){.key = KEY, .proc = PROC};
    CHECK(fake_listen(&f) == 0, "mute holder");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fake_holder_main, &f) == 0, "fake holder thread");
    c = replica_connect("127.0.0.1", f.port, PROC, 1000, ALLOW_PULL, KEY, err, sizeof err);
    CHECK(c != NULL, "connect to the mute holder: %s", err);
    if (c) {
        SnapHeader h;
        void *p = NULL;
        t0 = now_ms();
        replica_status st = replica_get(c, JOB, 0, -1, &h, &p, 200);
        dt = now_ms() - t0;
        CHECK(st == REPLICA_IO && dt < 1500, "GET from a mute holder: %s after %.0f ms", replica_status_str(st), dt);
        replica_close(c);
    }
    f.stop = 1;
    pthread_join(t, NULL);
    close(f.lfd);
    /* and a PUT far bigger than the socket buffers, to a holder that never reads */
    f = (FakeHolder){.key = KEY, .proc = PROC};
    CHECK(fake_listen(&f) == 0, "mute holder");
    CHECK(pthread_create(&t, NULL, fake_holder_main, &f) == 0, "fake holder thread");
    c = replica_connect("127.0.0.1", f.port, PROC, 1000, 0, KEY, err, sizeof err);
    CHECK(c != NULL, "connect to the mute holder: %s", err);
    if (c) {
        size_t len = 64u << 20;
        unsigned char *big = calloc(1, len);
        SnapHeader h = make_header(JOB, 0, 0, big, len);
        t0 = now_ms();
        replica_status st = replica_put(c, &h, big, 300);
        dt = now_ms() - t0;
        /* bounded by 300 ms plus the payload's time at the floor rate (3.4 s for 64 MiB) */
        double bound = 300.0 + (double)len / TRANSFER_FLOOR_BYTES_PER_MS;
        CHECK(st == REPLICA_IO && dt < bound + 1200, "PUT to a mute holder: %s after %.0f ms (bound %.0f)",
              replica_status_str(st), dt, bound);
        free(big);
        replica_close(c);
    }
    f.stop = 1;
    pthread_join(t, NULL);
    int port = f.port;
    close(f.lfd);
    t0 = now_ms();
    c = replica_connect("127.0.0.1", port, PROC, 500, ALLOW_PULL, KEY, err, sizeof err); /* nobody listens any more */
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
    s = replica_server_start("127.0.0.1", port, JOB, WORLD, PROC, KEY, err, sizeof err);
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
    RawConn rcs[3];
    for (int i = 0; i < 3; i++) {
        SnapHeader h = make_header(JOB, 0, 5 + i, p, len);
        CHECK(raw_open(s, &rcs[i]) == 0 && raw_put_partial(&rcs[i], &h, p, i < 2 ? len / 4 : 100) == 0,
              "partial PUT %d", i);
    }
    ReplicaConn *idle = connect_to(s); /* and one idle client connection */
    sleep_ms(100);                     /* let the holder reach its blocking points */
    double t0 = now_ms();
    replica_server_stop(s);
    double dt = now_ms() - t0;
    printf("# replica_server_stop with 3 transfers in flight: %.1f ms\n", dt);
    CHECK(dt < 2000, "stop took %.0f ms", dt);
    for (int i = 0; i < 3; i++) raw_close(&rcs[i]);
    replica_close(idle);
    free(p);
}

/* ---- authentication and bounds ---- */

/* Requests from a client that skips the handshake (as any local user who knows the job id
 * could send them, here a forged generation with valid CRCs): the holder reads a would-be
 * proof, closes, and has sent nothing but its hello; nothing is stored, served or allocated. */
static void test_unauthenticated_requests_get_nothing(void) {
    ReplicaServer *s = start_server();
    ReplicaConn *c = s ? connect_to(s) : NULL;
    if (!c) { replica_server_stop(s); return; }
    int port = replica_server_port(s);
    size_t len = 1u << 20;
    CHECK(put_gen(c, 1, 3, len) == REPLICA_OK, "authenticated PUT");
    unsigned char *p = make_payload(2, 7, len);
    SnapHeader forged = make_header(JOB, 2, 7, p, len);
    SnapHeader big = make_header(JOB, 3, -1, "", 0);
    big.length = 40u << 20;
    snap_header_seal(&big);
    RawPullSource src = this_process(p);
    size_t before = th_resident_bytes();
    for (int kind = 0; kind < 4; kind++) {
        const char *what = (const char *[]){"PUT", "GET", "RESERVE", "PULL"}[kind];
        unsigned char req[1 + sizeof(SnapHeader) + sizeof src];
        size_t n = 1 + sizeof(SnapHeader);
        req[0] = (unsigned char)(const char[]){REPLICA_REQ_PUT, REPLICA_REQ_GET, REPLICA_REQ_RESERVE, REPLICA_REQ_PULL}[kind];
        memcpy(req + 1, kind == 2 ? &big : &forged, sizeof(SnapHeader));
        if (kind == 1) { /* GET of rank 1, which the holder has */
            memset(req + 1, 0, 52);
            snprintf((char *)req + 1, 40, "%s", JOB);
            int32_t rank = 1;
            int64_t max_step = -1;
            memcpy(req + 41, &rank, 4);
            memcpy(req + 45, &max_step, 8);
            n = 53;
        }
        if (kind == 3) {
            memcpy(req + n, &src, sizeof src);
            n += sizeof src;
        }
        int fd = raw_tcp(port);
        CHECK(fd >= 0, "connect");
        if (fd < 0) continue;
        raw_send(fd, req, n);
        if (kind == 0) raw_send(fd, p, len); /* may fail: the holder has closed */
        size_t got = raw_drain(fd);
        CHECK(got <= 36, "unauthenticated %s: the holder sent %zu bytes, more than its hello", what, got);
        close(fd);
    }
    size_t grown = th_resident_bytes() - before;
    CHECK(grown < (16u << 20), "unauthenticated RESERVE of 2 x 40 MiB grew the holder by %zu bytes", grown);
    SnapHeader h;
    void *got = NULL;
    CHECK(replica_server_lookup(s, 2, -1, &h, &got) == REPLICA_NOT_FOUND, "the forged generation was stored");
    free(got);
    expect_gen(c, 1, -1, 3, len); /* the holder serves its clients as before */
    free(p);
    replica_close(c);
    replica_server_stop(s);
}

/* A client with another job's key cannot connect, so it cannot PUT, GET, RESERVE or PULL; and
 * a client refuses a holder that cannot prove it has the job's key. */
static void test_wrong_key_refused(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    int port = replica_server_port(s);
    char err[256] = "";
    ReplicaConn *c = replica_connect("127.0.0.1", port, PROC, TIMEOUT_MS, ALLOW_PULL, OTHER_KEY, err, sizeof err);
    CHECK(c == NULL && err[0], "a client with another job's key was let in");
    printf("# wrong key: %s\n", err);
    replica_close(c);

    size_t len = 1u << 20;
    unsigned char *p = make_payload(2, 7, len);
    SnapHeader forged = make_header(JOB, 2, 7, p, len);
    RawPullSource src = this_process(p);
    for (int kind = 0; kind < 4; kind++) {
        RawConn rc;
        int hs = raw_open_key(port, OTHER_KEY, &rc);
        CHECK(hs == -1, "handshake with another job's key: %d, want -1 (closed by the holder)", hs);
        /* whatever follows is never read */
        unsigned char req[1 + sizeof forged + sizeof src] = {(unsigned char)"PGRL"[kind]};
        memcpy(req + 1, &forged, sizeof forged);
        memcpy(req + 1 + sizeof forged, &src, sizeof src);
        if (rc.fd >= 0) {
            raw_send(rc.fd, req, sizeof req);
            CHECK(raw_drain(rc.fd) == 0, "the holder answered a client that failed the handshake");
        }
        raw_close(&rc);
    }
    SnapHeader h;
    void *got = NULL;
    CHECK(replica_server_lookup(s, 2, -1, &h, &got) == REPLICA_NOT_FOUND, "something was stored");
    free(got);
    free(p);
    replica_server_stop(s);

    /* the other way round: a "holder" whose proof is wrong gets nothing from a client */
    FakeHolder f = {.key = KEY, .proc = PROC, .bad_proof = 1};
    pthread_t t;
    CHECK(fake_listen(&f) == 0 && pthread_create(&t, NULL, fake_holder_main, &f) == 0, "fake holder");
    c = replica_connect("127.0.0.1", f.port, PROC, TIMEOUT_MS, ALLOW_PULL, KEY, err, sizeof err);
    CHECK(c == NULL && strstr(err, "prove"), "a holder without the key was accepted (%s)", err);
    replica_close(c);
    f.stop = 1;
    pthread_join(t, NULL);
    CHECK(f.client_proof_ok, "the client's own proof was wrong");
    close(f.lfd);
}

/* After the handshake every request carries its MAC: a request with a wrong tag, or one
 * replayed (on the same connection or another), closes the connection unanswered. */
static void test_requests_need_their_mac(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    size_t len = 100000;
    unsigned char *p = make_payload(2, 7, len);
    SnapHeader h = make_header(JOB, 2, 7, p, len);
    unsigned char req[1 + sizeof h] = {REPLICA_REQ_PUT}, tag[32];
    memcpy(req + 1, &h, sizeof h);

    RawConn rc;
    CHECK(raw_open(s, &rc) == 0, "handshake");
    raw_tag(&rc, 'C', rc.tx, req, sizeof req, tag);
    tag[5] ^= 1;
    raw_send(rc.fd, req, sizeof req);
    raw_send(rc.fd, tag, sizeof tag);
    raw_send(rc.fd, p, len);
    CHECK(raw_drain(rc.fd) == 0, "a PUT with a wrong MAC was answered");
    raw_close(&rc);
    SnapHeader got;
    void *gp = NULL;
    CHECK(replica_server_lookup(s, 2, -1, &got, &gp) == REPLICA_NOT_FOUND, "a PUT with a wrong MAC was stored");
    free(gp);

    /* a good PUT, then the very same bytes again: on this connection, and on another one */
    CHECK(raw_open(s, &rc) == 0, "handshake");
    raw_tag(&rc, 'C', rc.tx, req, sizeof req, tag);
    CHECK(raw_put_partial(&rc, &h, p, len) == 0 && raw_status(&rc) == REPLICA_OK, "a good raw PUT");
    raw_send(rc.fd, req, sizeof req);
    raw_send(rc.fd, tag, sizeof tag);
    CHECK(raw_drain(rc.fd) == 0, "a PUT replayed on its connection was answered");
    raw_close(&rc);
    CHECK(raw_open(s, &rc) == 0, "handshake");
    raw_send(rc.fd, req, sizeof req);
    raw_send(rc.fd, tag, sizeof tag);
    CHECK(raw_drain(rc.fd) == 0, "a PUT replayed on another connection was answered");
    raw_close(&rc);
    gp = NULL;
    CHECK(replica_server_lookup(s, 2, -1, &got, &gp) == REPLICA_OK && got.step == 7, "the good PUT is kept");
    free(gp);
    free(p);
    replica_server_stop(s);
}

static int thread_count(void) {
    char line[256];
    int n = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

/* A process squatting a dead holder's port (issue 27, item 1): whoever connects there meaning
 * the dead holder gets relayed to another, live holder of the job (which has the same key),
 * and with `forge` the GET reply's payload is rewritten (32 floats) with its CRC32C fixed up. */
typedef struct {
    int lfd, port;   /* the squatted port */
    int to_port;     /* the live holder it relays to */
    int forge;
    int payloads;    /* GET payloads that went through */
} Relay;

static int relay_copy(int from, int to, size_t n) {
    unsigned char buf[65536];
    while (n > 0) {
        size_t k = n < sizeof buf ? n : sizeof buf;
        if (raw_recv(from, buf, k) != 0 || raw_send(to, buf, k) != 0) return -1;
        n -= k;
    }
    return 0;
}

static void *relay_pump(void *arg) { /* client -> holder, as it comes */
    int *fds = arg;
    unsigned char buf[65536];
    ssize_t r;
    while ((r = recv(fds[0], buf, sizeof buf, 0)) > 0)
        if (raw_send(fds[1], buf, (size_t)r) != 0) break;
    shutdown(fds[1], SHUT_WR);
    return NULL;
}

static void *relay_main(void *arg) {
    Relay *r = arg;
    int client = accept(r->lfd, NULL, NULL), up = raw_tcp(r->to_port);
    if (client < 0 || up < 0) {
        if (client >= 0) close(client);
        if (up >= 0) close(up);
        return NULL;
    }
    struct timeval tv = {.tv_sec = 5};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int fds[2] = {client, up};
    pthread_t t;
    pthread_create(&t, NULL, relay_pump, fds);
    /* holder -> client: the hello and the holder's proof as they are, then GET replies */
    if (relay_copy(up, client, 36) == 0 && relay_copy(up, client, 32) == 0) {
        unsigned char msg[4 + sizeof(SnapHeader) + 32];
        int32_t st;
        while (raw_recv(up, msg, 4) == 0) {
            memcpy(&st, msg, 4);
            if (st != REPLICA_OK) {
                if (raw_send(client, msg, 4) != 0 || relay_copy(up, client, 32) != 0) break;
                continue;
            }
            SnapHeader h;
            if (raw_recv(up, msg + 4, sizeof msg - 4) != 0) break;
            memcpy(&h, msg + 4, sizeof h);
            unsigned char *pl = h.length < (64u << 20) ? malloc(h.length + 1) : NULL;
            if (!pl || raw_recv(up, pl, h.length) != 0) { free(pl); break; }
            if (r->forge && h.length >= 132) forge_keeping_crc(pl, h.length);
            r->payloads++;
            int sent = raw_send(client, msg, sizeof msg) == 0 && raw_send(client, pl, h.length) == 0;
            free(pl);
            if (!sent) break;
            /* whatever follows the payload (its tag, today) goes through as it is */
            unsigned char rest[16];
            if (relay_copy(up, client, sizeof rest) != 0) break;
        }
    }
    shutdown(client, SHUT_RDWR);
    shutdown(up, SHUT_RDWR);
    pthread_join(t, NULL);
    close(client);
    close(up);
    return NULL;
}

static void test_port_squatter_relaying_to_another_holder_refused(void) {
    char err[256] = "";
    ReplicaServer *live = replica_server_start("127.0.0.1", 0, JOB, WORLD, PROC + 1, KEY, err, sizeof err);
    CHECK(live != NULL, "live holder: %s", err);
    if (!live) return;
    int live_port = replica_server_port(live);
    ReplicaConn *owner = replica_connect("127.0.0.1", live_port, PROC + 1, TIMEOUT_MS, 0, KEY, err, sizeof err);
    CHECK(owner != NULL, "the owner reaches the live holder: %s", err);
    size_t len = 1u << 20;
    if (owner) CHECK(put_gen(owner, 0, 5, len) == REPLICA_OK, "PUT into the live holder");
    replica_close(owner);

    /* The holders list names holder PROC, dead, at the port the squatter now holds. */
    for (int forge = 0; forge < 2; forge++) {
        Relay r = {.to_port = live_port, .forge = forge};
        FakeHolder l = {0};
        CHECK(fake_listen(&l) == 0, "squatter's listener");
        r.lfd = l.lfd;
        r.port = l.port;
        pthread_t t;
        CHECK(pthread_create(&t, NULL, relay_main, &r) == 0, "relay thread");
        ReplicaConn *spare = replica_connect("127.0.0.1", r.port, PROC, 2000, 0, KEY, err, sizeof err);
        CHECK(spare == NULL, "%s relay to another holder got through the handshake",
              forge ? "a forging" : "a plain");
        if (!spare) printf("# squatter%s: %s\n", forge ? " (forging)" : "", err);
        if (spare) {
            SnapHeader h;
            void *got = NULL;
            replica_status st = replica_get(spare, JOB, 0, -1, &h, &got, 2000);
            unsigned char *want = make_payload(0, 5, len);
            CHECK(st != REPLICA_OK, "the spare took rank 0's state (%s) from the holder it did not mean",
                  got && memcmp(got, want, len) != 0 ? "forged bytes, CRC fixed up" : "another holder's bytes");
            free(want);
            free(got);
            replica_close(spare);
        }
        pthread_join(t, NULL);
        close(l.lfd);
    }
    /* and straight at the live holder's port while meaning another holder (a stale holders
     * list, the port reused by another process of the job) */
    ReplicaConn *c = replica_connect("127.0.0.1", live_port, PROC, 2000, 0, KEY, err, sizeof err);
    CHECK(c == NULL, "holder %d answered a client that meant holder %d", PROC + 1, PROC);
    replica_close(c);
    replica_server_stop(live);
}

/* Payloads altered on the way with their CRC32C fixed up (what an on-path attacker without the
 * key can do to bytes in flight): a GET reply is refused by the client, a PUT by the holder. */
static void test_altered_payloads_refused(void) {
    size_t len = 1u << 20;
    unsigned char *p = make_payload(3, 9, len);
    SnapHeader h = make_header(JOB, 3, 9, p, len);
    FakeHolder f = {.key = KEY, .proc = PROC, .serve_h = &h, .serve_payload = p};
    pthread_t t;
    CHECK(fake_listen(&f) == 0 && pthread_create(&t, NULL, fake_holder_main, &f) == 0, "fake holder");
    char err[256] = "";
    ReplicaConn *c = replica_connect("127.0.0.1", f.port, PROC, TIMEOUT_MS, 0, KEY, err, sizeof err);
    CHECK(c != NULL, "connect: %s", err);
    if (c) {
        SnapHeader got_h;
        void *got = NULL;
        replica_status st = replica_get(c, JOB, 3, -1, &got_h, &got, TIMEOUT_MS);
        CHECK(st == REPLICA_AUTH && got == NULL, "GET of a payload altered on the way: %s, want %s",
              replica_status_str(st), replica_status_str(REPLICA_AUTH));
        free(got);
        replica_close(c);
    }
    f.stop = 1;
    pthread_join(t, NULL);
    close(f.lfd);

    /* a PUT: the genuine header and payload tag, the bytes altered, their CRC fixed up */
    ReplicaServer *s = start_server();
    RawConn rc;
    if (s && raw_open(s, &rc) == 0) {
        unsigned char req[1 + sizeof h] = {REPLICA_REQ_PUT}, ptag[crypto_onetimeauth_BYTES];
        memcpy(req + 1, &h, sizeof h);
        CHECK(raw_request(&rc, req, sizeof req) == 0, "PUT request");
        raw_payload_tag(rc.ks, 'C', rc.tx - 1, p, len, ptag);
        unsigned char *forged = malloc(len);
        memcpy(forged, p, len);
        forge_keeping_crc(forged, len);
        CHECK(crc32c(0, forged, len) == h.crc && memcmp(forged, p, len) != 0, "the forgery keeps the CRC");
        raw_send(rc.fd, forged, len);
        raw_send(rc.fd, ptag, sizeof ptag);
        int32_t st = raw_status(&rc);
        CHECK(st == REPLICA_REFUSED || st == 1, "a PUT altered on the way: status %d", st);
        free(forged);
        SnapHeader stored;
        void *gp = NULL;
        CHECK(replica_server_lookup(s, 3, -1, &stored, &gp) == REPLICA_NOT_FOUND, "the altered PUT was stored");
        free(gp);
    }
    raw_close(&rc);
    replica_server_stop(s);
    free(p);
}

/* The holder takes the answer to its hello in whatever pieces it arrives (the accept thread
 * reads each as poll reports it: replica_hs_feed) and reads no byte past it: a request sent in
 * the same segment as the answer's last piece, before the holder's proof came back, is the
 * connection thread's and is answered. A peer that closes one byte short gets no proof. */
static void test_handshake_in_pieces_request_behind(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    int port = replica_server_port(s);
    char id[300];
    holder_id(id, PROC, port);
    int fd = raw_tcp(port);
    CHECK(fd >= 0, "connect");
    if (fd < 0) {
        replica_server_stop(s);
        return;
    }
    int one = 1; /* every piece its own segment */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char hello[36], out[64 + 1 + 40 + 4 + 8 + 32], proof[32], want[32];
    RawConn rc = {.fd = fd};
    CHECK(raw_recv(fd, hello, sizeof hello) == 0 && memcmp(hello, "DPR2", 4) == 0, "no hello");
    randombytes_buf(out, 32);
    raw_label(out + 32, KEY, "DPrepl02 client", hello + 4, out, id);
    raw_label(rc.ks, KEY, "DPrepl02 session", hello + 4, out, id);
    /* a GET and its tag right behind the answer */
    unsigned char *get = out + 64;
    int32_t rank = 3;
    int64_t max_step = -1;
    memset(get, 0, 1 + 40 + 4 + 8);
    get[0] = REPLICA_REQ_GET;
    snprintf((char *)get + 1, 40, "%s", JOB);
    memcpy(get + 41, &rank, 4);
    memcpy(get + 45, &max_step, 8);
    raw_tag(&rc, 'C', rc.tx++, get, 1 + 40 + 4 + 8, get + 1 + 40 + 4 + 8);
    CHECK(raw_send(fd, out, 1) == 0, "send");
    sleep_ms(30);
    CHECK(raw_send(fd, out + 1, 40) == 0, "send");
    sleep_ms(30);
    CHECK(raw_send(fd, out + 41, sizeof out - 41) == 0, "send"); /* the answer's last 23 bytes and the GET */
    CHECK(raw_recv(fd, proof, sizeof proof) == 0, "the holder refused an answer sent in pieces");
    raw_label(want, KEY, "DPrepl02 holder", hello + 4, out, id);
    CHECK(crypto_verify_32(proof, want) == 0, "the holder's proof is wrong");
    int32_t st = raw_status(&rc);
    CHECK(st == REPLICA_NOT_FOUND, "the GET sent behind the answer got %d, want %d (NOT_FOUND)", st, REPLICA_NOT_FOUND);
    raw_close(&rc);

    /* 63 bytes of a right answer, then the peer closes: no proof */
    fd = raw_tcp(port);
    CHECK(fd >= 0 && raw_recv(fd, hello, sizeof hello) == 0, "no hello");
    raw_label(out + 32, KEY, "DPrepl02 client", hello + 4, out, id);
    CHECK(raw_send(fd, out, 63) == 0, "send");
    shutdown(fd, SHUT_WR);
    CHECK(raw_drain(fd) == 0, "the holder answered an incomplete answer");
    close(fd);
    replica_server_stop(s);
}

/* Connections that never authenticate cost the holder a bounded number of threads, for a
 * bounded time; a client of the job behind them still gets in. */
static void test_handshake_flood_is_bounded(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    enum { FLOOD = 100 };
    int fds[FLOOD], base = thread_count();
    for (int i = 0; i < FLOOD; i++) fds[i] = raw_tcp(replica_server_port(s));
    sleep_ms(300);
    int during = thread_count();
    CHECK(during - base <= 64 + 2, "%d connections that never authenticate took %d threads", FLOOD, during - base);
    double t0 = now_ms();
    ReplicaConn *c = connect_to(s);
    printf("# %d connections that never authenticate: %d holder threads; a client behind them got in after %.0f ms\n",
           FLOOD, during - base, now_ms() - t0);
    if (c) CHECK(put_gen(c, 0, 1, 1000) == REPLICA_OK, "PUT after the flood");
    for (int i = 0; i < FLOOD; i++)
        if (fds[i] >= 0) close(fds[i]);
    replica_close(c);
    replica_server_stop(s);
}

/* A stranger (another user: `nobody` when this runs as root) keeps 300 connections open to a
 * holder's port and opens a new one whenever the holder closes one: none of them ever
 * authenticates. Clients of the job still get in, each within a 2 s bound, again and again
 * while the flood goes on, and what they PUT and GET is right. (The holder used to let at most
 * 64 connections shake hands at once for 5 s each, the rest waiting in the listen backlog: a
 * client behind 300 such connections waited ~9 s.) */
static void starve_holder(int FLOOD) {
    ReplicaServer *s = start_server();
    if (!s) return;
    enum { ROUNDS = 5, BOUND_MS = 2000 };
    int port = replica_server_port(s), ready[2];
    CHECK(pipe(ready) == 0, "pipe");
    pid_t child = fork();
    if (child == 0) { /* the stranger: no key, only connections */
        if (getuid() == 0 && (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
        int *fds = calloc((size_t)FLOOD, sizeof *fds), opened = 0;
        struct pollfd *p = calloc((size_t)FLOOD, sizeof *p);
        if (!fds || !p) _exit(5);
        for (int i = 0; i < FLOOD; i++) opened += (fds[i] = raw_tcp(port)) >= 0;
        char one = opened == FLOOD ? 'y' : 'n';
        if (write(ready[1], &one, 1) != 1) _exit(4);
        for (double end = now_ms() + 30000; now_ms() < end;) { /* re-open what the holder closed */
            for (int i = 0; i < FLOOD; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
            if (poll(p, (nfds_t)FLOOD, 100) <= 0) continue;
            for (int i = 0; i < FLOOD; i++) {
                char buf[64];
                if (!p[i].revents || (recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) > 0 && !(p[i].revents & POLLHUP)))
                    continue; /* the hello: read it and stay silent */
                close(fds[i]);
                fds[i] = raw_tcp(port);
            }
        }
        _exit(0);
    }
    char got = 0;
    CHECK(child > 0 && read(ready[0], &got, 1) == 1 && got == 'y', "the stranger opened %d connections", FLOOD);
    close(ready[0]);
    close(ready[1]);
    double worst = 0;
    for (int round = 0; round < ROUNDS; round++) {
        char err[256] = "";
        double t0 = now_ms();
        ReplicaConn *c = replica_connect("127.0.0.1", port, PROC, BOUND_MS, 0, KEY, err, sizeof err);
        CHECK(c != NULL, "round %d: a client of the job did not get in within %d ms: %s", round, BOUND_MS, err);
        if (!c) break;
        CHECK(put_gen(c, 0, round + 1, 1000 + round) == REPLICA_OK, "round %d: PUT during the flood", round);
        expect_gen(c, 0, -1, round + 1, 1000 + round);
        double ms = now_ms() - t0;
        if (ms > worst) worst = ms;
        replica_close(c);
        sleep_ms(200);
    }
    printf("# %d connections of a stranger that never authenticate, re-opened as they are closed: the slowest of %d "
           "clients got in and did a PUT and a GET in %.0f ms\n", FLOOD, ROUNDS, worst);
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    replica_server_stop(s);
}

/* As many as the brief's attack, and more than the holder lets wait for a proof (1024): the
 * oldest waiting ones are closed, the stranger re-opens them at once. */
static void test_starving_stranger_cannot_crowd_out_clients(void) { starve_holder(300); }
static void test_starving_stranger_beyond_the_cap(void) { starve_holder(1500); }

/* RESERVE and PUT are bounded by the job's real ranks and by the holder's byte budget. */
static void test_reserve_and_put_bounded(void) {
    ReplicaServer *s = start_server();
    ReplicaConn *c = s ? connect_to(s) : NULL;
    if (!c) { replica_server_stop(s); return; }
    const size_t mib = 1u << 20;
    /* the default budget: half the physical memory; a RESERVE of all of it is refused at once */
    SnapHeader h = make_header(JOB, 0, -1, "", 0);
    h.length = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    snap_header_seal(&h);
    size_t before = th_resident_bytes();
    replica_status st = replica_reserve(c, &h, TIMEOUT_MS);
    CHECK(st == REPLICA_REFUSED, "RESERVE of the whole physical memory: %s", replica_status_str(st));

    replica_server_set_max_bytes(s, 64 * mib);
    /* a made-up rank of a made-up world (the header is consistent in itself) */
    h = make_header(JOB, 999, -1, "", 0);
    h.world = 1000;
    h.length = 16 * mib;
    snap_header_seal(&h);
    st = replica_reserve(c, &h, TIMEOUT_MS);
    CHECK(st == REPLICA_REFUSED, "RESERVE for rank 999 of a job of %d: %s", WORLD, replica_status_str(st));
    unsigned char *p = make_payload(999, 1, 1000);
    h = make_header(JOB, 999, 1, p, 1000);
    h.world = 1000;
    snap_header_seal(&h);
    st = replica_put(c, &h, p, TIMEOUT_MS);
    CHECK(st == REPLICA_REFUSED, "PUT for rank 999 of a job of %d: %s", WORLD, replica_status_str(st));
    free(p);
    expect_status(c, JOB, WORLD, -1, REPLICA_NOT_FOUND);
    /* an absurd size for this budget */
    h = make_header(JOB, 0, -1, "", 0);
    h.length = 256 * mib;
    snap_header_seal(&h);
    st = replica_reserve(c, &h, TIMEOUT_MS);
    CHECK(st == REPLICA_REFUSED, "RESERVE of 2 x 256 MiB with a budget of 64 MiB: %s", replica_status_str(st));
    size_t grown = th_resident_bytes() - before;
    CHECK(grown < 16 * mib, "refused RESERVEs grew the holder by %zu bytes", grown);

    /* the budget fills up rank by rank: two ranks of 2 x 16 MiB fit, the third does not */
    for (int rank = 0; rank < 3; rank++) {
        h = make_header(JOB, rank, -1, "", 0);
        h.length = 16 * mib;
        snap_header_seal(&h);
        st = replica_reserve(c, &h, TIMEOUT_MS);
        CHECK(st == (rank < 2 ? REPLICA_OK : REPLICA_REFUSED), "RESERVE of rank %d: %s", rank, replica_status_str(st));
    }
    CHECK(put_gen(c, 2, 0, mib) == REPLICA_REFUSED, "a PUT over the budget");
    CHECK(put_gen(c, 0, 0, 16 * mib) == REPLICA_OK, "a PUT into reserved slots");
    CHECK(put_gen(c, 0, 1, 16 * mib) == REPLICA_OK, "a PUT into reserved slots");
    expect_gen(c, 0, -1, 1, 16 * mib);
    replica_server_set_max_bytes(s, 128 * mib); /* raised: rank 2 fits now */
    CHECK(put_gen(c, 2, 0, mib) == REPLICA_OK, "a PUT within the raised budget");
    replica_close(c);
    replica_server_stop(s);
}

/* A holder pulls only from the process at the other end of the connection: a PULL that
 * names another process (here a child holding the same bytes at the same address, which the
 * holder would be allowed to read) reads nothing and stores nothing. */
static void test_pull_only_from_the_requesting_process(void) {
    ReplicaServer *s = start_server();
    if (!s) return;
    size_t len = 1u << 20;
    unsigned char *p = make_payload(4, 9, len);
    SnapHeader h = make_header(JOB, 4, 9, p, len);
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0, "pipes");
    pid_t child = fork();
    if (child == 0) {
        char x = 'x';
        if (write(ready[1], &x, 1) != 1 || read(go[0], &x, 1) < 0) _exit(1);
        _exit(0);
    }
    char x;
    CHECK(child > 0 && read(ready[0], &x, 1) == 1, "child started");
    RawPullSource src = this_process(p);
    src.pid = child;
    CHECK(raw_pull(s, &h, &src) == REPLICA_NO_PULL, "a PULL naming another process (%d) was served", (int)child);
    src.pid = 1;
    CHECK(raw_pull(s, &h, &src) == REPLICA_NO_PULL, "a PULL naming process 1 was served");
    SnapHeader got;
    void *gp = NULL;
    CHECK(replica_server_lookup(s, 4, -1, &got, &gp) == REPLICA_NOT_FOUND, "bytes of another process were stored");
    free(gp);
    src.pid = getpid();
    int32_t own = raw_pull(s, &h, &src);
    CHECK(own == (can_pull() ? REPLICA_OK : REPLICA_NO_PULL), "a PULL of the requester's own memory: %d", own);
    x = 'g';
    CHECK(write(go[1], &x, 1) == 1, "release the child");
    waitpid(child, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    close(go[1]);
    free(p);
    replica_server_stop(s);
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
    char secret[REPLICA_SECRET_HEX_LEN + 1];
    if (replica_secret_new(secret, sizeof secret) != 0 || replica_key_derive(secret, KEY) != 0 ||
        replica_secret_new(secret, sizeof secret) != 0 || replica_key_derive(secret, OTHER_KEY) != 0) {
        printf("not ok - no channel keys\n");
        return 1;
    }
    RUN_TEST(test_key_derivation);
    RUN_TEST(test_header_seal_and_check);
    RUN_TEST(test_generations_and_max_step);
    RUN_TEST(test_get_into_a_callers_buffer);
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
    RUN_TEST(test_pull_computes_the_crc);
    RUN_TEST(test_pull_refused_when_unsafe);
    RUN_TEST(test_generations_and_max_step_pulled);
    RUN_TEST(test_bad_payload_refused_pulled);
    RUN_TEST(test_sender_dies_mid_transfer_pulled);
    RUN_TEST(test_concurrent_puts_and_gets_pulled);
    RUN_TEST(test_put_throughput_pulled);
    RUN_TEST(test_unauthenticated_requests_get_nothing);
    RUN_TEST(test_wrong_key_refused);
    RUN_TEST(test_port_squatter_relaying_to_another_holder_refused);
    RUN_TEST(test_altered_payloads_refused);
    RUN_TEST(test_requests_need_their_mac);
    RUN_TEST(test_handshake_in_pieces_request_behind);
    RUN_TEST(test_handshake_flood_is_bounded);
    RUN_TEST(test_starving_stranger_cannot_crowd_out_clients);
    RUN_TEST(test_starving_stranger_beyond_the_cap);
    RUN_TEST(test_reserve_and_put_bounded);
    RUN_TEST(test_pull_only_from_the_requesting_process);
    TEST_MAIN_END();
}
