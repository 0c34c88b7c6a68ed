/* replica.c — the replication channel: a holder keeps other ranks' per-iteration snapshots in
 * host memory (two generations per owner rank) and serves them back over TCP.
 *
 * Wire protocol. One TCP connection carries any number of requests, one after the other.
 * Integers are in host byte order (every DeadPool host is x86-64, little endian) and the
 * SnapHeader travels as its 88 raw bytes (no padding, checked below).
 *   PUT  request: 'P' (REPLICA_REQ_PUT), SnapHeader, then header.length payload bytes.
 *        reply:    int32 status, REPLICA_OK or REPLICA_REFUSED.
 *   GET  request: 'G' (REPLICA_REQ_GET), char job[40] (NUL-padded), int32 rank,
 *                 int64 max_step (< 0: newest).
 *        reply:    int32 status; when REPLICA_OK, then SnapHeader and header.length bytes.
 *                  Otherwise REPLICA_NOT_FOUND or REPLICA_CORRUPT and nothing more.
 *   PULL request: 'L' (REPLICA_REQ_PULL), SnapHeader, then a PullSource (below): where in
 *        which process on this machine the payload lies.
 *        reply:    int32 status: REPLICA_OK, REPLICA_REFUSED (bad header) or REPLICA_NO_PULL
 *                  (another machine or pid namespace, not permitted, or the bytes read did
 *                  not match the header's CRC): the sender then PUTs the same generation.
 *   RESERVE request: 'R' (REPLICA_REQ_RESERVE), SnapHeader (step unused): the owner's
 *        payload size, sent once when its snapshot engine starts.
 *        reply:    int32 status, REPLICA_OK or REPLICA_REFUSED (bad header).
 *        The holder allocates both of that owner's slots and faults their pages in before
 *        answering; slots holding a generation, or in use, are left alone.
 *        Same-machine replication this way (PULL) costs one copy (process_vm_readv, checksummed
 *        chunk by chunk while the chunk is in cache) instead of a send and a receive through
 *        the kernel's socket buffers. The sender blocks until the verdict, so its buffer does
 *        not change under the read.
 * A PUT whose header is already unacceptable (bad header checksum, other job, absurd rank or
 * length, no slot free in time, no memory) is refused before its payload: the holder sends
 * REPLICA_REFUSED, half-closes, discards input for a moment and closes, so the sender stops
 * pushing a payload nobody keeps. A PUT refused for its payload checksum leaves the
 * connection usable; the client reconnects after any refusal anyway, to stay simple.
 *
 * Holder. Per owner rank two slots {valid, busy, readers, header, buffer}. A PUT takes the
 * slot that does not hold the newest valid generation (newest = highest step, then epoch,
 * then arrival), marks it invalid and busy under the lock, then receives straight into its
 * buffer WITHOUT the lock, checksumming each piece as it arrives, and publishes (valid) under
 * the lock only if the payload CRC matches the header. A dropped sender leaves that slot
 * invalid and never touches the other one. GET and replica_server_lookup only see valid
 * slots; they pin one (readers++) and re-verify its CRC without the lock; GET then sends
 * straight from the slot (no second copy of a huge payload on the holder), lookup copies it
 * out in the same pass (crc32c_copy); then they unpin. A PUT never reuses a pinned or busy
 * slot: it waits on a condition variable (bounded) instead. If the stored bytes no longer match
 * their CRC (a memory fault), that slot is marked invalid and the next older valid generation
 * <= max_step is tried; when every candidate failed the answer is REPLICA_CORRUPT, when there
 * was none REPLICA_NOT_FOUND.
 *
 * Threads and bounds. One accept thread plus one thread per connection. Client calls are
 * bounded by their timeout (poll before every chunk against one overall deadline); the holder
 * drops a transfer that makes no progress for SERVER_STALL_MS. replica_server_stop shuts
 * down every connection socket, which wakes any thread blocked on it, and joins them all.
 * Every send uses MSG_NOSIGNAL, so a peer that vanished never raises SIGPIPE. */
#include "replica.h"

#include "checksum.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The header is hashed and sent as raw bytes: it must have no padding anywhere. */
_Static_assert(sizeof(SnapHeader) == 88, "SnapHeader must be 88 bytes with no padding");
_Static_assert(offsetof(SnapHeader, header_crc) == 84, "header_crc must be the last field");

#define REPLICA_MAX_PAYLOAD (1ULL << 36) /* 64 GiB: anything bigger is a corrupt length */
#define REPLICA_MAX_RANK (1 << 20)
#define JOB_LEN ((int)sizeof(((SnapHeader *)0)->job))
#define GET_REQ_LEN (JOB_LEN + 4 + 8)

#define SERVER_STALL_MS 30000 /* the holder drops a transfer with no progress for this long */
#define SLOT_WAIT_MS 30000    /* a PUT waits at most this long for a free slot */
#define REFUSE_DRAIN_MS 2000  /* after an early refusal, input is discarded this long */
#define IO_CHUNK (4u << 20)   /* bytes per send/recv call */
#define PULL_CHUNK (256u << 10) /* bytes per process_vm_readv: checksummed while still in L2 */

/* Where a PULL's payload lies: a process is named by its pid only within one kernel (boot)
 * and one pid namespace, so the holder pulls only when both match its own. */
typedef struct {
    char boot_id[40];  /* /proc/sys/kernel/random/boot_id, NUL-padded */
    uint64_t pidns;    /* inode of /proc/self/ns/pid */
    int64_t pid;
    uint64_t addr;
} PullSource;
_Static_assert(sizeof(PullSource) == 64, "PullSource travels as 64 raw bytes");

/* ------------------------------------------------------------------------------------- */
/* snapshot header                                                                        */
/* ------------------------------------------------------------------------------------- */

void snap_header_seal(SnapHeader *h) { h->header_crc = crc32c(0, h, offsetof(SnapHeader, header_crc)); }

const char *snap_header_check(const SnapHeader *h) {
    if (!h) return "no header";
    if (h->magic != SNAP_MAGIC) return "bad magic (not a DeadPool snapshot)";
    if (h->version != SNAP_VERSION) return "unsupported snapshot version";
    if (crc32c(0, h, offsetof(SnapHeader, header_crc)) != h->header_crc) return "header checksum mismatch";
    if (!memchr(h->job, '\0', sizeof h->job)) return "job name not NUL-terminated";
    if (h->job[0] == '\0') return "empty job name";
    if (h->world < 1) return "world size below 1";
    if (h->rank < 0 || h->rank >= h->world) return "rank outside [0, world)";
    if (h->length > REPLICA_MAX_PAYLOAD) return "payload length over 64 GiB";
    return NULL;
}

const char *replica_status_str(replica_status s) {
    switch (s) {
    case REPLICA_OK: return "ok";
    case REPLICA_IO: return "connection failed, closed or timed out";
    case REPLICA_REFUSED: return "refused by the holder (checksum or header mismatch)";
    case REPLICA_NOT_FOUND: return "no such generation";
    case REPLICA_CORRUPT: return "checksum mismatch on received data";
    case REPLICA_NO_PULL: return "the holder cannot read this process's memory";
    }
    return "unknown replica status";
}

/* ------------------------------------------------------------------------------------- */
/* bounded socket I/O                                                                     */
/* ------------------------------------------------------------------------------------- */

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct {
    int64_t deadline; /* CLOCK_MONOTONIC ms at which the transfer fails; INT64_MAX: never */
    int stall_ms;     /* > 0: every bit of progress moves the deadline to now + stall_ms */
} io_bound;

/* Client calls: one deadline for the whole call. */
static io_bound bound_total(int timeout_ms) {
    if (timeout_ms <= 0) timeout_ms = 1;
    return (io_bound){mono_ms() + timeout_ms, 0};
}

/* Holder: fail only when the peer stops making progress. */
static io_bound bound_stall(int stall_ms) { return (io_bound){mono_ms() + stall_ms, stall_ms}; }

static io_bound bound_none(void) { return (io_bound){INT64_MAX, 0}; }

static void bound_progress(io_bound *b) {
    if (b->stall_ms > 0) b->deadline = mono_ms() + b->stall_ms;
}

/* Waits until fd reports one of `events` (or an error/hangup). Returns the revents, 0 when
 * the bound expired, -1 on a poll failure. */
static int wait_fd(int fd, short events, const io_bound *b) {
    for (;;) {
        int ms = -1;
        if (b->deadline != INT64_MAX) {
            int64_t left = b->deadline - mono_ms();
            if (left <= 0) return 0;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r > 0) return p.revents;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* Sends buf[0..n). With watch_input, stops early when the peer has something to say (the
 * holder's early verdict). 0 all sent, 1 input is waiting, -1 failure or timeout. */
static int send_bytes(int fd, const void *buf, size_t n, io_bound *b, int watch_input) {
    const unsigned char *p = buf;
    while (n > 0) {
        int ev = wait_fd(fd, watch_input ? (POLLOUT | POLLIN) : POLLOUT, b);
        if (ev <= 0) return -1;
        if (watch_input && (ev & POLLIN)) return 1;
        ssize_t r = send(fd, p, n < IO_CHUNK ? n : IO_CHUNK, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

static int send_all(int fd, const void *buf, size_t n, io_bound *b) { return send_bytes(fd, buf, n, b, 0); }

/* Receives exactly n bytes into buf. When crc is given, *crc is continued over each piece
 * as it lands (still in cache), so verifying costs no second pass. 0, or -1 on EOF, error
 * or timeout. */
static int recv_all(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc) {
    unsigned char *p = buf;
    while (n > 0) {
        int ev = wait_fd(fd, POLLIN, b);
        if (ev <= 0) return -1;
        ssize_t r = recv(fd, p, n < IO_CHUNK ? n : IO_CHUNK, MSG_DONTWAIT);
        if (r == 0) return -1; /* peer closed */
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        if (crc) *crc = crc32c(*crc, p, (size_t)r);
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

static int send_status(int fd, replica_status st, io_bound *b) {
    int32_t v = (int32_t)st;
    return send_all(fd, &v, sizeof v, b);
}

/* Replication is request/response with small control messages: no Nagle delays. Keepalive
 * lets the kernel notice a peer host that disappeared while a connection sat idle. */
static void tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

/* This process as a PULL source: 0, or -1 when the kernel does not say (no /proc). */
static int pull_identity(PullSource *me) {
    memset(me, 0, sizeof *me);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return -1;
    int ok = fgets(me->boot_id, sizeof me->boot_id, f) != NULL;
    fclose(f);
    me->boot_id[strcspn(me->boot_id, "\n")] = 0;
    struct stat st;
    if (!ok || !me->boot_id[0] || stat("/proc/self/ns/pid", &st) != 0) return -1;
    me->pidns = (uint64_t)st.st_ino;
    me->pid = getpid();
    return 0;
}

/* Copies len bytes at src->addr in process src->pid into dst, continuing *crc over each
 * chunk as it lands. 0, or -1 (the process is gone, or we may not read it). */
static int pull_bytes(const PullSource *src, unsigned char *dst, uint64_t len, uint32_t *crc) {
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off < PULL_CHUNK ? (size_t)(len - off) : PULL_CHUNK;
        struct iovec local = {dst + off, n}, remote = {(void *)(uintptr_t)(src->addr + off), n};
        ssize_t got = process_vm_readv((pid_t)src->pid, &local, 1, &remote, 1, 0);
        if (got <= 0) return -1;
        *crc = crc32c(*crc, dst + off, (size_t)got);
        off += (uint64_t)got;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* holder state                                                                           */
/* ------------------------------------------------------------------------------------- */

typedef struct {
    int valid;          /* holds a verified generation that GET may serve */
    int busy;           /* a PUT is receiving into it: never served, never taken by another PUT */
    int readers;        /* GET/lookup copies in progress: a PUT must not reuse it yet */
    uint64_t seq;       /* publication order: breaks ties between equal (step, epoch) */
    SnapHeader h;       /* meaningful when valid */
    size_t cap;         /* bytes allocated at data */
    unsigned char *data;
} Slot;

typedef struct {
    int rank;
    Slot slot[2];
} Owner;

typedef struct Conn {
    ReplicaServer *srv;
    int fd;     /* closed only by whoever joins the thread, so shutdown() never hits a reused fd */
    int done;   /* the thread has finished and may be joined */
    pthread_t thread;
    struct Conn *next;
} Conn;

struct ReplicaServer {
    int listen_fd;
    int wake[2]; /* pipe: a byte in wake[0] tells the accept thread to stop */
    int port;
    char job[JOB_LEN];
    pthread_t accept_thread;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t slot_cv; /* a slot stopped being busy/pinned, or the server is stopping */
    int stopping;
    Conn *conns;
    Owner **owners;
    int n_owners, cap_owners;
    uint64_t next_seq;
    int64_t min_epoch; /* PUTs from older epochs are refused (fenced writers) */
    double put_cpu_ms; /* CPU time spent in PUTs and PULLs */
    PullSource self;   /* this process as a PULL source would name it */
    int self_known;    /* self is valid: PULLs are possible at all */
};

/* Under s->mu. The owner entry for rank, created when `create` (NULL if absent / no memory). */
static Owner *owner_find(ReplicaServer *s, int rank, int create) {
    for (int i = 0; i < s->n_owners; i++)
        if (s->owners[i]->rank == rank) return s->owners[i];
    if (!create) return NULL;
    if (s->n_owners == s->cap_owners) {
        int cap = s->cap_owners ? 2 * s->cap_owners : 8;
        Owner **grown = realloc(s->owners, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        s->owners = grown;
        s->cap_owners = cap;
    }
    Owner *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->rank = rank;
    s->owners[s->n_owners++] = o;
    return o;
}

static int slot_newer(const Slot *a, const Slot *b) {
    if (a->h.step != b->h.step) return a->h.step > b->h.step;
    if (a->h.epoch != b->h.epoch) return a->h.epoch > b->h.epoch;
    return a->seq > b->seq;
}

/* Under s->mu. The newest valid slot with step <= max_step (max_step < 0: any), or -1. */
static int pick_read_slot(const Owner *o, int64_t max_step) {
    int best = -1;
    for (int i = 0; i < 2; i++) {
        const Slot *sl = &o->slot[i];
        if (!sl->valid || (max_step >= 0 && sl->h.step > max_step)) continue;
        if (best < 0 || slot_newer(sl, &o->slot[best])) best = i;
    }
    return best;
}

/* Under s->mu. A slot a PUT may write now: not the newest valid generation, not being
 * written, not pinned by a reader. Slot 0 first. -1 if none is free right now. */
static int pick_put_slot(const Owner *o) {
    int newest = pick_read_slot(o, -1);
    for (int i = 0; i < 2; i++) {
        const Slot *sl = &o->slot[i];
        if (i != newest && !sl->busy && sl->readers == 0) return i;
    }
    return -1;
}

/* Under s->mu. Waits (at most SLOT_WAIT_MS) for pick_put_slot to find one. -1 on timeout
 * or when the server is stopping. */
static int wait_put_slot(ReplicaServer *s, Owner *o) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += SLOT_WAIT_MS / 1000;
    for (;;) {
        if (s->stopping) return -1;
        int idx = pick_put_slot(o);
        if (idx >= 0) return idx;
        if (pthread_cond_timedwait(&s->slot_cv, &s->mu, &until) == ETIMEDOUT) {
            return s->stopping ? -1 : pick_put_slot(o);
        }
    }
}

/* Ends a PUT on its (busy) slot: publishes it when h is given, else leaves it invalid. */
static void slot_finish_put(ReplicaServer *s, Slot *sl, const SnapHeader *h) {
    pthread_mutex_lock(&s->mu);
    if (h) {
        sl->h = *h;
        sl->seq = ++s->next_seq;
        sl->valid = 1;
    }
    sl->busy = 0;
    pthread_cond_broadcast(&s->slot_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Makes a busy slot's buffer hold at least len bytes. Called without the lock: a busy slot
 * belongs to its PUT alone. The old bytes are dead, so free + malloc rather than realloc,
 * which would copy them. 0, or -1 without memory (the slot is then left empty). */
static int slot_reserve(Slot *sl, size_t len) {
    if (sl->cap >= len) return 0;
    free(sl->data);
    sl->cap = 0;
    sl->data = alloc_huge(len);
    if (!sl->data) return -1;
    sl->cap = len;
    return 0;
}

static void slot_unpin(ReplicaServer *s, Slot *sl) {
    pthread_mutex_lock(&s->mu);
    if (--sl->readers == 0) pthread_cond_broadcast(&s->slot_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Finds the newest generation of rank <= max_step whose stored bytes still match their CRC
 * (see the file comment), pinned so no PUT reuses it, and re-verified without the lock.
 * With `copy`, the bytes are copied out in the same pass (crc32c_copy) into a malloc'ed
 * *payload and the slot is unpinned again; without, *pinned is the slot, still pinned: the
 * caller reads sl->data and then calls slot_unpin. OK, NOT_FOUND, CORRUPT (every candidate
 * failed), or IO (out of memory for the copy). */
static replica_status find_verified(ReplicaServer *s, int rank, int64_t max_step, int copy, SnapHeader *h,
                                    void **payload, Slot **pinned) {
    int saw_corrupt = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        Owner *o = owner_find(s, rank, 0);
        int idx = o ? pick_read_slot(o, max_step) : -1;
        if (idx < 0) {
            pthread_mutex_unlock(&s->mu);
            return saw_corrupt ? REPLICA_CORRUPT : REPLICA_NOT_FOUND;
        }
        Slot *sl = &o->slot[idx];
        SnapHeader hh = sl->h;
        sl->readers++; /* pinned: no PUT reuses it while we read it without the lock */
        pthread_mutex_unlock(&s->mu);

        unsigned char *out = NULL;
        uint32_t crc;
        if (copy) {
            out = malloc(hh.length ? hh.length : 1);
            if (!out) {
                slot_unpin(s, sl);
                return REPLICA_IO;
            }
            crc = crc32c_copy(0, out, sl->data, hh.length);
        } else {
            crc = crc32c(0, sl->data, hh.length);
        }
        if (crc == hh.crc) {
            *h = hh;
            if (copy) {
                slot_unpin(s, sl);
                *payload = out;
            } else {
                *pinned = sl;
            }
            return REPLICA_OK;
        }
        /* The bytes changed after they were verified on arrival: a memory fault. This
         * generation is useless; drop it and try the other one. */
        free(out);
        pthread_mutex_lock(&s->mu);
        if (--sl->readers == 0) pthread_cond_broadcast(&s->slot_cv);
        sl->valid = 0;
        saw_corrupt = 1;
        log_msg("replica: stored generation step %lld of rank %d failed its checksum; dropped",
                (long long)hh.step, rank);
    }
}

replica_status replica_server_lookup(ReplicaServer *s, int rank, int64_t max_step, SnapHeader *h, void **payload) {
    *payload = NULL;
    if (!s || rank < 0 || rank > REPLICA_MAX_RANK) return REPLICA_NOT_FOUND;
    replica_status st = find_verified(s, rank, max_step, 1, h, payload, NULL);
    return st == REPLICA_IO ? REPLICA_NOT_FOUND : st; /* out of memory: nothing to hand out */
}

int replica_server_debug_flip(ReplicaServer *s, int rank, int64_t step, uint64_t offset) {
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    Owner *o = owner_find(s, rank, 0);
    for (int i = 0; o && i < 2; i++) {
        Slot *sl = &o->slot[i];
        if (sl->valid && sl->h.step == step && offset < sl->h.length) {
            sl->data[offset] ^= 1;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ------------------------------------------------------------------------------------- */
/* holder: serving one connection                                                         */
/* ------------------------------------------------------------------------------------- */

/* Refuses a PUT before its payload: the verdict, a half-close, then input is discarded for
 * a moment so the sender reads the verdict instead of a connection reset. */
static void refuse_early(int fd) {
    io_bound b = bound_stall(REFUSE_DRAIN_MS);
    if (send_status(fd, REPLICA_REFUSED, &b) != 0) return;
    shutdown(fd, SHUT_WR);
    b = bound_total(REFUSE_DRAIN_MS);
    char sink[65536];
    while (wait_fd(fd, POLLIN, &b) > 0) {
        ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return;
    }
}

/* What makes a PUT header unacceptable to this holder, or NULL. */
static const char *put_header_problem(const ReplicaServer *s, const SnapHeader *h) {
    const char *bad = snap_header_check(h);
    if (bad) return bad;
    if (strncmp(h->job, s->job, sizeof h->job) != 0) return "snapshot of another job";
    if (h->rank > REPLICA_MAX_RANK) return "rank out of range";
    if (h->length > REPLICA_MAX_PAYLOAD) return "payload too large";
    if (h->epoch < __atomic_load_n(&s->min_epoch, __ATOMIC_ACQUIRE)) return "snapshot from a fenced epoch";
    return NULL;
}

void replica_server_set_min_epoch(ReplicaServer *s, int64_t epoch) {
    __atomic_store_n(&s->min_epoch, epoch, __ATOMIC_RELEASE);
}

/* The slot a new generation of h->rank goes into, marked busy with room for its payload, or
 * NULL (no slot free in time, no memory, stopping). */
static Slot *take_put_slot(ReplicaServer *s, const SnapHeader *h) {
    pthread_mutex_lock(&s->mu);
    Owner *o = owner_find(s, h->rank, 1);
    int idx = o ? wait_put_slot(s, o) : -1;
    if (idx < 0) {
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    Slot *sl = &o->slot[idx];
    sl->valid = 0; /* from here on its old contents are gone */
    sl->busy = 1;
    pthread_mutex_unlock(&s->mu);
    if (slot_reserve(sl, h->length) != 0) {
        slot_finish_put(s, sl, NULL);
        return NULL;
    }
    return sl;
}

/* One PULL (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_pull(ReplicaServer *s, int fd) {
    SnapHeader h;
    PullSource src;
    io_bound b = bound_stall(SERVER_STALL_MS);
    if (recv_all(fd, &h, sizeof h, &b, NULL) != 0 || recv_all(fd, &src, sizeof src, &b, NULL) != 0) return 0;
    if (put_header_problem(s, &h)) return send_status(fd, REPLICA_REFUSED, &b) == 0;
    src.boot_id[sizeof src.boot_id - 1] = 0;
    if (!s->self_known || strcmp(s->self.boot_id, src.boot_id) != 0 || s->self.pidns != src.pidns)
        return send_status(fd, REPLICA_NO_PULL, &b) == 0;
    Slot *sl = take_put_slot(s, &h);
    if (!sl) return send_status(fd, REPLICA_REFUSED, &b) == 0;
    uint32_t crc = 0;
    int good = pull_bytes(&src, sl->data, h.length, &crc) == 0 && crc == h.crc;
    slot_finish_put(s, sl, good ? &h : NULL);
    return send_status(fd, good ? REPLICA_OK : REPLICA_NO_PULL, &b) == 0;
}

/* One RESERVE (the type byte already read). 1 to keep serving the connection, 0 to close it.
 * A slot is only taken while it is free in every sense (no generation, no PUT, no reader),
 * and marked busy meanwhile, so a PUT arriving during the page faults waits for it. */
static int serve_reserve(ReplicaServer *s, int fd) {
    SnapHeader h;
    io_bound b = bound_stall(SERVER_STALL_MS);
    if (recv_all(fd, &h, sizeof h, &b, NULL) != 0) return 0;
    if (put_header_problem(s, &h)) return send_status(fd, REPLICA_REFUSED, &b) == 0;
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&s->mu);
        Owner *o = owner_find(s, h.rank, 1);
        Slot *sl = o ? &o->slot[i] : NULL;
        int take = sl && !sl->valid && !sl->busy && sl->readers == 0 && sl->cap < h.length;
        if (take) sl->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (!take) continue;
        if (slot_reserve(sl, h.length) == 0) prefault(sl->data, h.length);
        slot_finish_put(s, sl, NULL);
    }
    b = bound_stall(SERVER_STALL_MS);
    return send_status(fd, REPLICA_OK, &b) == 0;
}

/* One PUT (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_put(ReplicaServer *s, int fd) {
    SnapHeader h;
    io_bound b = bound_stall(SERVER_STALL_MS);
    if (recv_all(fd, &h, sizeof h, &b, NULL) != 0) return 0;
    if (put_header_problem(s, &h)) {
        refuse_early(fd);
        return 0;
    }

    Slot *sl = take_put_slot(s, &h);
    if (!sl) {
        refuse_early(fd);
        return 0;
    }
    uint32_t crc = 0;
    b = bound_stall(SERVER_STALL_MS);
    if (recv_all(fd, sl->data, h.length, &b, &crc) != 0) {
        slot_finish_put(s, sl, NULL); /* sender gone mid-payload: the other slot is untouched */
        return 0;
    }
    int good = crc == h.crc;
    slot_finish_put(s, sl, good ? &h : NULL);
    return send_status(fd, good ? REPLICA_OK : REPLICA_REFUSED, &b) == 0;
}

/* One GET (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_get(ReplicaServer *s, int fd) {
    unsigned char req[GET_REQ_LEN];
    io_bound b = bound_stall(SERVER_STALL_MS);
    if (recv_all(fd, req, sizeof req, &b, NULL) != 0) return 0;
    char job[JOB_LEN];
    int32_t rank;
    int64_t max_step;
    memcpy(job, req, JOB_LEN);
    memcpy(&rank, req + JOB_LEN, sizeof rank);
    memcpy(&max_step, req + JOB_LEN + sizeof rank, sizeof max_step);

    SnapHeader h;
    Slot *sl = NULL;
    replica_status st = REPLICA_NOT_FOUND;
    int job_ok = memchr(job, '\0', sizeof job) && strncmp(job, s->job, sizeof job) == 0;
    if (job_ok && rank >= 0 && rank <= REPLICA_MAX_RANK) st = find_verified(s, rank, max_step, 0, &h, NULL, &sl);
    if (st != REPLICA_OK) return send_status(fd, st, &b) == 0;

    /* Sent straight from the pinned slot: no second copy of a possibly huge payload. A PUT
     * that needs this slot waits until the send ends (bounded by the stall limit). */
    unsigned char head[sizeof(int32_t) + sizeof(SnapHeader)];
    int32_t ok = REPLICA_OK;
    memcpy(head, &ok, sizeof ok);
    memcpy(head + sizeof ok, &h, sizeof h);
    int rc = send_all(fd, head, sizeof head, &b) == 0 && send_all(fd, sl->data, h.length, &b) == 0;
    slot_unpin(s, sl);
    return rc;
}

static void *conn_main(void *arg) {
    Conn *c = arg;
    pthread_setname_np(pthread_self(), "dp-holder");
    ReplicaServer *s = c->srv;
    for (;;) {
        unsigned char type;
        io_bound idle = bound_none(); /* an idle connection may wait for its next request */
        if (recv_all(c->fd, &type, 1, &idle, NULL) != 0) break;
        int keep = 0;
        double cpu0 = thread_cpu_ms();
        if (type == REPLICA_REQ_PUT) keep = serve_put(s, c->fd);
        else if (type == REPLICA_REQ_GET) keep = serve_get(s, c->fd);
        else if (type == REPLICA_REQ_PULL) keep = serve_pull(s, c->fd);
        else if (type == REPLICA_REQ_RESERVE) keep = serve_reserve(s, c->fd);
        if (type == REPLICA_REQ_PUT || type == REPLICA_REQ_PULL) {
            double used = thread_cpu_ms() - cpu0;
            pthread_mutex_lock(&s->mu);
            s->put_cpu_ms += used;
            pthread_mutex_unlock(&s->mu);
        }
        if (!keep) break; /* unknown request type: the stream cannot be trusted */
    }
    pthread_mutex_lock(&s->mu);
    c->done = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Joins each connection's thread, then closes its socket and frees it. */
static void join_conns(Conn *list) {
    while (list) {
        Conn *next = list->next;
        pthread_join(list->thread, NULL);
        close(list->fd);
        free(list);
        list = next;
    }
}

/* Joins and frees the connection threads that have finished. */
static void reap_done_conns(ReplicaServer *s) {
    Conn *done = NULL;
    pthread_mutex_lock(&s->mu);
    for (Conn **pp = &s->conns; *pp;) {
        Conn *c = *pp;
        if (c->done) {
            *pp = c->next;
            c->next = done;
            done = c;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    join_conns(done);
}

static void start_conn(ReplicaServer *s, int fd) {
    Conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping && pthread_create(&c->thread, NULL, conn_main, c) == 0;
    if (ok) {
        c->next = s->conns;
        s->conns = c;
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        close(fd);
        free(c);
    }
}

static void *accept_main(void *arg) {
    ReplicaServer *s = arg;
    pthread_setname_np(pthread_self(), "dp-holder-acc");
    for (;;) {
        struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
        /* the timeout only paces the reaping of finished connection threads */
        int r = poll(p, 2, 1000);
        if (r < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        reap_done_conns(s);
        if (r <= 0 || !(p[0].revents & POLLIN)) continue;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* out of descriptors or memory: back off instead of spinning on a ready socket */
            if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) sleep_ms(10);
            continue;
        }
        tune_socket(fd);
        start_conn(s, fd);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* holder: start / stop                                                                   */
/* ------------------------------------------------------------------------------------- */

/* A listening socket on host:port (host NULL/"" = every interface). fd, or -1 + err. */
static int listen_on(const char *host, int port, char *err, size_t errlen) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (host && !*host) host = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        set_err(err, errlen, "replica server: cannot resolve '%s': %s", host ? host : "*", gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) set_err(err, errlen, "replica server: cannot listen on %s:%d: %s", host ? host : "*", port, strerror(saved));
    return fd;
}

static int bound_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

static void free_owners(ReplicaServer *s) {
    for (int i = 0; i < s->n_owners; i++) {
        free(s->owners[i]->slot[0].data);
        free(s->owners[i]->slot[1].data);
        free(s->owners[i]);
    }
    free(s->owners);
}

ReplicaServer *replica_server_start(const char *bind_host, int port, const char *job, char *err, size_t errlen) {
    if (!job || !*job) {
        set_err(err, errlen, "replica server: empty job name");
        return NULL;
    }
    if (port < 0 || port > 65535) {
        set_err(err, errlen, "replica server: port %d out of range", port);
        return NULL;
    }
    ReplicaServer *s = calloc(1, sizeof *s);
    if (!s) {
        set_err(err, errlen, "replica server: out of memory");
        return NULL;
    }
    s->self_known = pull_identity(&s->self) == 0;
    /* Truncated exactly as snprintf into SnapHeader.job truncates it, so names compare equal. */
    snprintf(s->job, sizeof s->job, "%s", job);
    s->wake[0] = s->wake[1] = -1;
    s->listen_fd = listen_on(bind_host, port, err, errlen);
    if (s->listen_fd < 0) goto fail;
    s->port = bound_port(s->listen_fd);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        set_err(err, errlen, "replica server: pipe: %s", strerror(errno));
        goto fail;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* wait_put_slot's deadline */
    pthread_cond_init(&s->slot_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->accept_thread, NULL, accept_main, s) != 0) {
        set_err(err, errlen, "replica server: cannot start its thread");
        pthread_cond_destroy(&s->slot_cv);
        pthread_mutex_destroy(&s->mu);
        goto fail;
    }
    return s;
fail:
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    free(s);
    return NULL;
}

int replica_server_port(const ReplicaServer *s) { return s ? s->port : -1; }

double replica_server_cpu_ms(ReplicaServer *s) {
    pthread_mutex_lock(&s->mu);
    double ms = s->put_cpu_ms;
    pthread_mutex_unlock(&s->mu);
    return ms;
}

void replica_server_stop(ReplicaServer *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->slot_cv); /* PUTs waiting for a slot give up */
    pthread_mutex_unlock(&s->mu);
    ssize_t w;
    do w = write(s->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(s->accept_thread, NULL); /* no connection is added after this */

    /* Shutting a socket down wakes every poll/recv/send on it, so each connection thread,
     * even one mid-transfer, returns promptly. */
    pthread_mutex_lock(&s->mu);
    Conn *conns = s->conns;
    s->conns = NULL;
    for (Conn *c = conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    join_conns(conns);

    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free_owners(s);
    pthread_cond_destroy(&s->slot_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ------------------------------------------------------------------------------------- */
/* client                                                                                 */
/* ------------------------------------------------------------------------------------- */

struct ReplicaConn {
    int fd; /* -1 after a failure: the next call reconnects */
    int port;
    char host[256];
    int pull;        /* try PULL first; cleared for good when the holder cannot pull */
    int last_pulled; /* the last successful put was a PULL */
    PullSource me;
};

/* Connects to host:port within the bound. fd (non-blocking, tuned), or -1 + err. Name
 * resolution itself is not bounded; holders are given as addresses in practice. */
static int connect_bounded(const char *host, int port, io_bound *b, char *err, size_t errlen) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        set_err(err, errlen, "replica: cannot resolve '%s': %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = ETIMEDOUT;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            int ev = wait_fd(fd, POLLOUT, b);
            int soerr = ETIMEDOUT;
            socklen_t len = sizeof soerr;
            if (ev > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) soerr = errno;
            rc = (ev > 0 && soerr == 0) ? 0 : -1;
            errno = soerr;
        }
        if (rc != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        set_err(err, errlen, "replica: cannot connect to %s:%d: %s", host, port, strerror(saved));
        return -1;
    }
    tune_socket(fd);
    return fd;
}

ReplicaConn *replica_connect(const char *host, int port, int timeout_ms, int allow_pull, char *err, size_t errlen) {
    if (!host || strlen(host) >= sizeof(((ReplicaConn *)0)->host) || port <= 0 || port > 65535) {
        set_err(err, errlen, "replica: bad holder address %s:%d", host ? host : "(null)", port);
        return NULL;
    }
    ReplicaConn *c = calloc(1, sizeof *c);
    if (!c) {
        set_err(err, errlen, "replica: out of memory");
        return NULL;
    }
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    c->pull = allow_pull && pull_identity(&c->me) == 0;
    /* Where the kernel restricts reading a process to its ancestors (Yama ptrace_scope 1),
     * let our holders, which are siblings, read us. */
    if (c->pull) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    io_bound b = bound_total(timeout_ms);
    c->fd = connect_bounded(host, port, &b, err, errlen);
    if (c->fd < 0) {
        free(c);
        return NULL;
    }
    return c;
}

void replica_close(ReplicaConn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c);
}

/* After a failure the byte stream is out of step: drop it, the next call reconnects. */
static void conn_drop(ReplicaConn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Makes sure there is a usable connection. An idle connection the holder has closed reads
 * as "ready" (EOF), and nothing else may arrive between requests, so a readable socket is
 * replaced before use. 0, or -1. */
static int conn_ready(ReplicaConn *c, io_bound *b) {
    if (c->fd >= 0) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) conn_drop(c);
    }
    if (c->fd < 0) c->fd = connect_bounded(c->host, c->port, b, NULL, 0);
    return c->fd >= 0 ? 0 : -1;
}

/* Sends a whole request and reads the holder's int32 status. OK and `keeps` (a second
 * status after which the connection stays usable) are returned as they are; after anything
 * else the connection is dropped: REFUSED, or IO for a broken or nonsensical reply. */
static replica_status request_status(ReplicaConn *c, const void *req, size_t len, replica_status keeps, io_bound *b) {
    int32_t st;
    if (send_all(c->fd, req, len, b) != 0 || recv_all(c->fd, &st, sizeof st, b, NULL) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_OK || st == (int32_t)keeps) return (replica_status)st;
    conn_drop(c);
    return st == REPLICA_REFUSED ? REPLICA_REFUSED : REPLICA_IO;
}

/* Asks the holder to pull the payload out of our memory. OK, REFUSED, NO_PULL or IO. */
static replica_status put_by_pull(ReplicaConn *c, const SnapHeader *h, const void *payload, io_bound *b) {
    unsigned char req[1 + sizeof(SnapHeader) + sizeof(PullSource)];
    PullSource src = c->me;
    src.addr = (uint64_t)(uintptr_t)payload;
    req[0] = REPLICA_REQ_PULL;
    memcpy(req + 1, h, sizeof *h);
    memcpy(req + 1 + sizeof *h, &src, sizeof src);
    return request_status(c, req, sizeof req, REPLICA_NO_PULL, b);
}

replica_status replica_reserve(ReplicaConn *c, const SnapHeader *h, int timeout_ms) {
    if (!c || !h) return REPLICA_IO;
    io_bound b = bound_total(timeout_ms);
    if (conn_ready(c, &b) != 0) return REPLICA_IO;
    unsigned char req[1 + sizeof(SnapHeader)];
    req[0] = REPLICA_REQ_RESERVE;
    memcpy(req + 1, h, sizeof *h);
    return request_status(c, req, sizeof req, REPLICA_OK, &b);
}

int replica_last_put_pulled(const ReplicaConn *c) { return c && c->last_pulled; }

replica_status replica_put(ReplicaConn *c, const SnapHeader *h, const void *payload, int timeout_ms) {
    if (!c || !h || (h->length > 0 && !payload)) return REPLICA_IO;
    io_bound b = bound_total(timeout_ms);
    if (conn_ready(c, &b) != 0) return REPLICA_IO;
    c->last_pulled = 0;
    if (c->pull && h->length > 0) {
        replica_status st = put_by_pull(c, h, payload, &b);
        if (st != REPLICA_NO_PULL) {
            c->last_pulled = st == REPLICA_OK;
            return st;
        }
        c->pull = 0; /* this holder cannot read us: TCP from now on */
    }

    unsigned char head[1 + sizeof(SnapHeader)];
    head[0] = REPLICA_REQ_PUT;
    memcpy(head + 1, h, sizeof *h);
    int sent = send_bytes(c->fd, head, sizeof head, &b, 1);
    if (sent == 0) sent = send_bytes(c->fd, payload, h->length, &b, 1);
    int32_t st;
    /* sent == 1: the holder answered early (a refusal) before taking the whole payload */
    if (sent < 0 || recv_all(c->fd, &st, sizeof st, &b, NULL) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_OK && sent == 0) return REPLICA_OK;
    conn_drop(c); /* after a refusal the holder may have closed: start clean next time */
    return st == REPLICA_REFUSED ? REPLICA_REFUSED : REPLICA_IO;
}

replica_status replica_get(ReplicaConn *c, const char *job, int rank, int64_t max_step, SnapHeader *h,
                           void **payload, int timeout_ms) {
    if (payload) *payload = NULL;
    if (!c || !job || !h || !payload) return REPLICA_IO;
    io_bound b = bound_total(timeout_ms);
    if (conn_ready(c, &b) != 0) return REPLICA_IO;

    unsigned char req[1 + GET_REQ_LEN];
    memset(req, 0, sizeof req);
    req[0] = REPLICA_REQ_GET;
    snprintf((char *)req + 1, JOB_LEN, "%s", job); /* truncated like SnapHeader.job */
    int32_t r32 = rank;
    memcpy(req + 1 + JOB_LEN, &r32, sizeof r32);
    memcpy(req + 1 + JOB_LEN + sizeof r32, &max_step, sizeof max_step);
    int32_t st;
    if (send_all(c->fd, req, sizeof req, &b) != 0 || recv_all(c->fd, &st, sizeof st, &b, NULL) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_NOT_FOUND || st == REPLICA_CORRUPT) return (replica_status)st;
    if (st != REPLICA_OK) {
        conn_drop(c);
        return REPLICA_IO;
    }

    SnapHeader got;
    if (recv_all(c->fd, &got, sizeof got, &b, NULL) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    /* A header that fails its checks, or is not what was asked for, makes the length
     * untrustworthy: the rest of the stream cannot be parsed. */
    if (snap_header_check(&got) || got.rank != rank || strncmp(got.job, (char *)req + 1, JOB_LEN) != 0 ||
        (max_step >= 0 && got.step > max_step)) {
        conn_drop(c);
        return REPLICA_CORRUPT;
    }
    unsigned char *buf = malloc(got.length ? got.length : 1);
    if (!buf) {
        conn_drop(c);
        return REPLICA_IO;
    }
    uint32_t crc = 0;
    if (recv_all(c->fd, buf, got.length, &b, &crc) != 0) {
        free(buf);
        conn_drop(c);
        return REPLICA_IO;
    }
    if (crc != got.crc) { /* damaged in transit; the stream itself is still in step */
        free(buf);
        return REPLICA_CORRUPT;
    }
    *h = got;
    *payload = buf;
    return REPLICA_OK;
}
