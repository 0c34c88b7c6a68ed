/* fuzz_replica.c — the replica holder's handshake and request parsing (src/data/replica.c),
 * through a real socket: for each input a fresh in-process holder (replica_server_start on
 * 127.0.0.1, a free port, a job of FUZZ_WORLD ranks, a budget of FUZZ_BUDGET bytes) gets one
 * connection, whose bytes come from the input; it answers as it would any client and is then
 * stopped. Its connection thread must not crash, hang or leak, whatever arrives.
 *
 * Input: one byte of flags, then the stream. Without flag 0x10 the stream goes out raw right
 * after the holder's hello, as an unauthenticated peer's handshake answer and whatever
 * follows. With 0x10 the harness first completes the handshake with the job's key, as
 * replica.c's client does, meaning this holder (FUZZ_PROC on its port), or with 0x80 too
 * meaning another holder of the job (a relay): the holder must then close the connection
 * without its proof, and the stream goes out raw. Otherwise the stream is a sequence of
 * requests ('P' PUT, 'G' GET,
 * 'L' PULL, 'R' RESERVE, framed as replica.c describes them) which the harness walks the way
 * the holder frames them: it fixes each request up as the flags say and appends the request's
 * MAC tag (session key, direction 'C', sequence number), so the fuzzer reaches the parsing
 * behind the MAC and the checksums:
 *   0x01  job name = the holder's job (headers and GET requests)
 *   0x02  header sealed: magic, version, world and header CRC made valid
 *   0x04  PUT/PULL payload CRC = the CRC of the bytes that follow / will be pulled
 *   0x40  a PUT payload's tag (Poly1305, replica.c) is right; without it the 16 bytes after
 *         the payload come from the input
 *   0x08  PULL source = this process (the one at the other end of the connection: boot id,
 *         pid namespace, pid) and an address inside a buffer of known bytes
 *   0x20  the last request's tag is wrong (the holder must close without acting on it)
 * Bounds are the holder's own (the job's world, the budget): nothing is clamped here.
 *
 * The handshake, the session key and the tags are computed here as replica.c's file comment
 * specifies them (libsodium's crypto_auth); should that change, the harness stops at once on
 * "the holder refused a correct handshake". The input's end (a half-close) is sent once every
 * request sent whole has been answered, as a client waits for its answers: the holder pulls
 * only from a peer whose connection is still established. FUZZ_REPLICA_VERBOSE=1 prints the
 * status of every reply. */
#include "fuzz_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "checksum.h"
#include "replica.h"

#define FUZZ_JOB "fuzz-job"
#define FUZZ_PROC 5 /* the holder's process id in the job: part of its identity */
#define FUZZ_WORLD 4
#define FUZZ_BUDGET (1u << 20)
#define FUZZ_SECRET "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define HDR sizeof(SnapHeader)
#define JOB_BYTES sizeof(((SnapHeader *)0)->job)
#define GET_LEN (JOB_BYTES + 4 + 8)
#define TAG crypto_auth_BYTES
#define PTAG crypto_onetimeauth_BYTES
#define NONCE 32

/* replica.c's PullSource, as it travels (72 bytes). */
typedef struct {
    char boot_id[40];
    uint64_t pidns;
    int64_t pid;
    uint64_t addr;
    uint32_t crc_known;
    uint32_t unused;
} PullSource;
_Static_assert(sizeof(PullSource) == 72, "PullSource is 72 bytes on the wire");

static unsigned char key[REPLICA_KEY_BYTES];
static PullSource self;
static int verbose; /* FUZZ_REPLICA_VERBOSE=1: every reply's status on stderr */
static unsigned char pull_area[2 * FUZZ_BUDGET];

static void init_once(void) {
    static int done;
    if (done) return;
    done = 1;
    /* The holder's threads get 512 KiB stacks instead of 8 MiB: ASan poisons and clears the
     * shadow of every thread's stack, two threads per input. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 << 10);
    pthread_setattr_default_np(&attr);
    pthread_attr_destroy(&attr);
    FUZZ_CHECK(sodium_init() >= 0, "libsodium");
    FUZZ_CHECK(replica_key_derive(FUZZ_SECRET, key) == 0, "replica_key_derive");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(self.boot_id, sizeof self.boot_id, f)) self.boot_id[0] = 0;
        fclose(f);
    }
    self.boot_id[strcspn(self.boot_id, "\n")] = 0;
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) self.pidns = (uint64_t)st.st_ino;
    self.pid = getpid();
    verbose = getenv("FUZZ_REPLICA_VERBOSE") && *getenv("FUZZ_REPLICA_VERBOSE") == '1';
    for (size_t i = 0; i < sizeof pull_area; i++) pull_area[i] = (unsigned char)(i * 131 + 7);
}

/* MAC(key, label || nh || nc || id): the handshake's proofs and the session key; id is the
 * holder's identity "PROC@HOST:PORT" (replica.c). */
static void mac_label(unsigned char out[TAG], const unsigned char *k, const char *label, const unsigned char *nh,
                      const unsigned char *nc, const char *id) {
    unsigned char in[32 + 2 * NONCE + 300];
    size_t n = strlen(label), m = strlen(id);
    memcpy(in, label, n);
    memcpy(in + n, nh, NONCE);
    memcpy(in + n + NONCE, nc, NONCE);
    memcpy(in + n + 2 * NONCE, id, m);
    crypto_auth(out, in, n + 2 * NONCE + m, k);
}

/* The tag of a payload that follows request number seq (replica.c: Poly1305 under a key
 * derived from the session key for that payload alone). */
static void payload_tag(unsigned char out[PTAG], const unsigned char *ks, uint64_t seq, const unsigned char *p,
                        size_t n) {
    unsigned char otk[crypto_onetimeauth_KEYBYTES];
    crypto_kdf_derive_from_key(otk, sizeof otk, seq, "DPpayC02", ks);
    crypto_onetimeauth(out, p, n, otk);
}

/* A growing output buffer, and the type of every request framed into it (replies come back
 * in that order). */
typedef struct {
    unsigned char *b;
    size_t n, cap;
    char *types;
    size_t nreq, capreq;
    size_t expect; /* replies to wait for before half-closing: the requests sent whole */
} Out;

static void out_put(Out *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 256;
        o->b = realloc(o->b, o->cap);
        FUZZ_CHECK(o->b != NULL, "out of memory");
    }
    if (n) memcpy(o->b + o->n, p, n);
    o->n += n;
}

/* Appends request msg[0..len) and its tag (session key ks, direction 'C', sequence *seq). */
static void out_request(Out *o, const unsigned char *ks, uint64_t *seq, const unsigned char *msg, size_t len,
                        size_t *last_tag) {
    unsigned char in[1 + 8 + 1 + HDR + sizeof(PullSource)], tag[TAG];
    in[0] = 'C';
    memcpy(in + 1, seq, 8);
    memcpy(in + 9, msg, len);
    crypto_auth(tag, in, 9 + len, ks);
    (*seq)++;
    out_put(o, msg, len);
    *last_tag = o->n;
    out_put(o, tag, TAG);
    if (o->nreq == o->capreq) {
        o->capreq = o->capreq * 2 + 16;
        o->types = realloc(o->types, o->capreq);
        FUZZ_CHECK(o->types != NULL, "out of memory");
    }
    o->types[o->nreq++] = (char)msg[0];
}

/* Frames s[0..n) as requests, fixed up and tagged as `flags` say (see the file comment). */
static void frame_requests(Out *o, const unsigned char *s, size_t n, unsigned flags, const unsigned char *ks) {
    uint64_t seq = 0;
    size_t i = 0, last_tag = SIZE_MAX;
    while (i < n) {
        unsigned char msg[1 + HDR + sizeof(PullSource)];
        unsigned char type = s[i];
        msg[0] = type;
        if (type == REPLICA_REQ_GET) {
            if (n - i - 1 < GET_LEN) break;
            memcpy(msg + 1, s + i + 1, GET_LEN);
            if (flags & 0x01) {
                memset(msg + 1, 0, JOB_BYTES);
                memcpy(msg + 1, FUZZ_JOB, strlen(FUZZ_JOB));
            }
            out_request(o, ks, &seq, msg, 1 + GET_LEN, &last_tag);
            o->expect = o->nreq;
            i += 1 + GET_LEN;
            continue;
        }
        if (type != REPLICA_REQ_PUT && type != REPLICA_REQ_PULL && type != REPLICA_REQ_RESERVE) break;
        size_t len = 1 + HDR + (type == REPLICA_REQ_PULL ? sizeof(PullSource) : 0);
        if (n - i < len) break;
        memcpy(msg, s + i, len);
        i += len;
        SnapHeader h;
        memcpy(&h, msg + 1, HDR);
        if (flags & 0x01) {
            memset(h.job, 0, sizeof h.job);
            memcpy(h.job, FUZZ_JOB, strlen(FUZZ_JOB));
        }
        if (type == REPLICA_REQ_PUT && (flags & 0x04)) {
            size_t have = n - i < h.length ? n - i : (size_t)h.length;
            h.crc = crc32c(0, s + i, have);
        }
        if (type == REPLICA_REQ_PULL) {
            PullSource src;
            memcpy(&src, msg + 1 + HDR, sizeof src);
            if (flags & 0x08) {
                uint64_t off = src.addr % FUZZ_BUDGET;
                memcpy(src.boot_id, self.boot_id, sizeof src.boot_id);
                src.pidns = self.pidns;
                src.pid = self.pid;
                src.addr = (uint64_t)(uintptr_t)(pull_area + off);
                if ((flags & 0x04) && h.length <= FUZZ_BUDGET) h.crc = crc32c(0, pull_area + off, h.length);
            }
            memcpy(msg + 1 + HDR, &src, sizeof src);
        }
        if (flags & 0x02) {
            h.magic = SNAP_MAGIC;
            h.version = SNAP_VERSION;
            h.world = FUZZ_WORLD;
            snap_header_seal(&h);
        }
        memcpy(msg + 1, &h, HDR);
        out_request(o, ks, &seq, msg, len, &last_tag);
        o->expect = o->nreq;
        if (type == REPLICA_REQ_PUT) { /* the payload, as long as the header says, then its tag */
            size_t have = n - i < h.length ? n - i : (size_t)h.length;
            out_put(o, s + i, have);
            if (have < h.length) {
                o->expect--; /* answered only when the connection ends */
                i += have;
                continue;
            }
            if (flags & 0x40) {
                unsigned char pt[PTAG];
                payload_tag(pt, ks, seq - 1, s + i, have);
                out_put(o, pt, PTAG);
                i += have;
            } else {
                i += have;
                size_t t = n - i < PTAG ? n - i : PTAG;
                out_put(o, s + i, t);
                i += t;
                if (t < PTAG) o->expect--;
            }
        }
        continue;
    }
    if ((flags & 0x20) && last_tag != SIZE_MAX) o->b[last_tag] ^= 1;
    out_put(o, s + i, n - i); /* whatever could not be framed goes as it is */
}

/* Counts the holder's replies as they arrive: int32 status and tag, and for a GET answered
 * REPLICA_OK the SnapHeader before the tag and the payload and its tag after it (replica.c). */
typedef struct {
    size_t done;             /* replies complete */
    unsigned char head[4 + HDR];
    size_t have;             /* bytes of the current reply's head */
    uint64_t skip;           /* bytes of the current reply still to come after its head */
} Replies;

static void replies_feed(Replies *r, const Out *o, const unsigned char *b, size_t n) {
    while (n > 0) {
        if (r->skip) {
            size_t k = n < r->skip ? n : (size_t)r->skip;
            r->skip -= k, b += k, n -= k;
            if (!r->skip) r->done++;
            continue;
        }
        size_t want = 4;
        if (r->have >= 4) {
            int32_t st;
            memcpy(&st, r->head, 4);
            if (st == REPLICA_OK && r->done < o->nreq && o->types[r->done] == REPLICA_REQ_GET) want = 4 + HDR;
        }
        if (r->have < want) {
            size_t k = n < want - r->have ? n : want - r->have;
            memcpy(r->head + r->have, b, k);
            r->have += k, b += k, n -= k;
            if (want == 4 && r->have == 4 && verbose) {
                int32_t st;
                memcpy(&st, r->head, 4);
                fprintf(stderr, "fuzz_replica: reply %zu (to '%c'): %s\n", r->done,
                        r->done < o->nreq ? o->types[r->done] : '?', replica_status_str((replica_status)st));
            }
            if (r->have < want || want == 4) continue; /* a status: look at it first */
        }
        r->skip = TAG;
        if (want == 4 + HDR) {
            SnapHeader h;
            memcpy(&h, r->head + 4, HDR);
            r->skip += h.length + PTAG;
        }
        r->have = 0;
    }
}

/* Threads of this process (/proc/self/stat field 20). */
static int thread_count(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "/proc/self/stat: %s", strerror(errno));
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    FUZZ_CHECK(r > 0, "/proc/self/stat: short read");
    buf[r] = 0;
    char *p = strrchr(buf, ')');
    FUZZ_CHECK(p != NULL, "/proc/self/stat: no ')'");
    int field = 2;
    for (; *p && field < 20; p++)
        if (*p == ' ') field++;
    int threads = field == 20 ? atoi(p) : -1;
    FUZZ_CHECK(threads > 0, "/proc/self/stat: no thread count");
    return threads;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads exactly n bytes (blocking socket, bounded by SO_RCVTIMEO). 0, or -1. libFuzzer's
 * timer signal (-timeout) interrupts blocking calls now and then: EINTR is retried. */
static int read_exact(int fd, unsigned char *b, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_exact(int fd, const unsigned char *b, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    if (size == 0) return 0;
    unsigned flags = data[0];
    char err[512] = "";
    ReplicaServer *s = replica_server_start("127.0.0.1", 0, FUZZ_JOB, FUZZ_WORLD, FUZZ_PROC, key, err, sizeof err);
    FUZZ_CHECK(s != NULL, "replica_server_start: %s", err);
    replica_server_set_max_bytes(s, FUZZ_BUDGET);
    int base = thread_count(); /* this process and the holder's accept thread */

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)replica_server_port(s))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, sizeof a)) != 0 && (errno == EINTR || errno == EALREADY)) {}
    FUZZ_CHECK(rc == 0 || errno == EISCONN, "connect: %s", strerror(errno));
    struct linger lin = {1, 0}; /* closed with a reset: no TIME_WAIT left behind per input */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lin, sizeof lin);
    int one = 1; /* no Nagle: small writes go at once, not after a delayed ACK */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    /* The holder's hello: from here on its thread for this connection exists, and it ends
     * only after reading what we send, so "threads back to base" below means it finished. */
    unsigned char hello[4 + NONCE];
    FUZZ_CHECK(read_exact(fd, hello, sizeof hello) == 0 && memcmp(hello, "DPR2", 4) == 0, "no hello from the holder: %s",
               strerror(errno));

    Out out = {0};
    if (flags & 0x10) {
        unsigned char answer[NONCE + TAG], proof[TAG], ks[TAG];
        char id[300];
        /* 0x80: meaning another holder of the job, as a client relayed to this one does */
        snprintf(id, sizeof id, "%d@127.0.0.1:%d", (flags & 0x80) ? FUZZ_PROC + 1 : FUZZ_PROC, replica_server_port(s));
        for (int i = 0; i < NONCE; i++) answer[i] = (unsigned char)(i + flags);
        mac_label(answer + NONCE, key, "DPrepl02 client", hello + 4, answer, id);
        FUZZ_CHECK(write_exact(fd, answer, sizeof answer) == 0, "handshake send: %s", strerror(errno));
        if (flags & 0x80) {
            FUZZ_CHECK(read_exact(fd, proof, sizeof proof) != 0, "the holder answered a client that meant another holder");
            out_put(&out, data + 1, size - 1);
        } else {
            FUZZ_CHECK(read_exact(fd, proof, sizeof proof) == 0, "the holder refused a correct handshake");
            unsigned char want[TAG];
            mac_label(want, key, "DPrepl02 holder", hello + 4, answer, id);
            FUZZ_CHECK(memcmp(proof, want, TAG) == 0, "the holder's proof is wrong");
            mac_label(ks, key, "DPrepl02 session", hello + 4, answer, id);
            frame_requests(&out, data + 1, size - 1, flags, ks);
        }
    } else {
        out_put(&out, data + 1, size - 1);
    }
    FUZZ_CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0, "fcntl: %s", strerror(errno));

    /* Send the stream and read whatever comes back, until the holder's thread has ended. The
     * end of the input (a half-close) is sent once every request sent whole was answered, as a
     * client waits for its answers: the holder pulls only from a peer whose connection is still
     * established (or when it answered early and closed, or after IDLE_S without progress,
     * should the holder wait for bytes this harness did not count on). */
    const double IDLE_S = 0.1;
    Replies rep = {0};
    size_t sent = 0;
    int shut = 0, eof = 0;
    unsigned char sink[65536];
    double deadline = mono_s() + 20, last_progress = mono_s();
    for (;;) {
        int progress = 0;
        struct pollfd p = {.fd = fd, .events = (short)((eof ? 0 : POLLIN) | (sent < out.n ? POLLOUT : 0))};
        if (p.events && poll(&p, 1, 0) > 0) {
            if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
                if (r > 0) { replies_feed(&rep, &out, sink, (size_t)r); progress = 1; }
                else if (r == 0 || (errno != EAGAIN && errno != EINTR)) eof = 1;
            }
            if ((p.revents & POLLOUT) && sent < out.n) {
                ssize_t w = send(fd, out.b + sent, out.n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) { sent += (size_t)w; progress = 1; }
                else if (w < 0 && errno != EAGAIN && errno != EINTR) sent = out.n; /* reset: nothing more goes */
            }
        }
        double now = mono_s();
        if (progress) last_progress = now;
        if (sent == out.n && !shut && (eof || rep.done >= out.expect || now - last_progress > IDLE_S)) {
            shutdown(fd, SHUT_WR);
            shut = 1;
            continue;
        }
        if (progress) continue;
        if (thread_count() <= base) break;
        FUZZ_CHECK(now < deadline, "the holder's connection thread still runs 20 s after the input ended");
        /* Wait a little for the holder (on two cores, spinning here would slow it down). */
        nanosleep(&(struct timespec){0, 30000}, NULL);
    }
    close(fd);
    replica_server_stop(s);
    free(out.b);
    free(out.types);
    return 0;
}
