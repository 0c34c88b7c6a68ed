/* replica_holder.c — a holder's state: the slots that keep other ranks' generations (two per
 * owner), what it holds and for whom, and the server's start and stop (its listener and its
 * threads). The protocol is replica.c's; the connections are replica_serve.c's. */
#include "replica.h"
#include "replica_internal.h"

#include "checksum.h"
#include "replica_handshake.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "secret.h"
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
/* Under s->mu. The owner entry for rank, created when `create` (NULL if absent / no memory). */
Owner *rpl_owner_find(ReplicaServer *s, int rank, int create) {
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
int rpl_wait_put_slot(ReplicaServer *s, Owner *o) {
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
void rpl_slot_finish_put(ReplicaServer *s, Slot *sl, const SnapHeader *h) {
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

/* Makes a busy slot's buffer hold at least len bytes, within the holder's budget. Called
 * without the lock: a busy slot belongs to its PUT alone (its cap and data too). The old bytes
 * are dead, so free + malloc rather than realloc, which would copy them. 0, or -1 over budget
 * (the slot is left as it was) or without memory (the slot is then left empty). */
int rpl_slot_reserve(ReplicaServer *s, Slot *sl, size_t len) {
    if (sl->cap >= len) return 0;
    pthread_mutex_lock(&s->mu);
    int fits = s->held_bytes - sl->cap + len <= s->max_bytes;
    if (fits) s->held_bytes = s->held_bytes - sl->cap + len; /* counted before it is allocated */
    pthread_mutex_unlock(&s->mu);
    if (!fits) {
        log_msg("replica: refused a slot of %zu bytes: the holder's budget of %llu bytes would be exceeded", len,
                (unsigned long long)s->max_bytes);
        return -1;
    }
    free(sl->data);
    sl->cap = 0;
    sl->data = alloc_huge(len);
    if (!sl->data) {
        pthread_mutex_lock(&s->mu);
        s->held_bytes -= len;
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    sl->cap = len;
    return 0;
}

void rpl_slot_unpin(ReplicaServer *s, Slot *sl) {
    pthread_mutex_lock(&s->mu);
    if (--sl->readers == 0) pthread_cond_broadcast(&s->slot_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Finds the newest generation of rank <= max_step whose stored bytes still match their CRC
 * (see the file comment), pinned so no PUT reuses it, and re-verified without the lock.
 * With `copy`, the bytes are copied out in the same pass (crc32c_copy) into a malloc'ed
 * *payload and the slot is unpinned again; without, *pinned is the slot, still pinned: the
 * caller reads sl->data and then calls rpl_slot_unpin, and when `mac` is given (a GET) it covers
 * the bytes of the generation found, computed in the same pass. OK, NOT_FOUND, CORRUPT (every
 * candidate failed), or IO (out of memory for the copy). */
replica_status rpl_find_verified(ReplicaServer *s, int rank, int64_t max_step, int copy, SnapHeader *h,
                                    void **payload, Slot **pinned, crypto_onetimeauth_state *mac) {
    int saw_corrupt = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        Owner *o = rpl_owner_find(s, rank, 0);
        int idx = o ? pick_read_slot(o, max_step) : -1;
        if (idx < 0) {
            pthread_mutex_unlock(&s->mu);
            return saw_corrupt ? REPLICA_CORRUPT : REPLICA_NOT_FOUND;
        }
        Slot *sl = &o->slot[idx];
        SnapHeader hh = sl->h;
        sl->readers++; /* pinned: no PUT reuses it while we read it without the lock */
        if (rank == s->corrupt_rank && hh.length > 0) sl->data[hh.length / 2] ^= 0x10; /* --inject corrupt */
        pthread_mutex_unlock(&s->mu);

        unsigned char *out = NULL;
        uint32_t crc = 0;
        crypto_onetimeauth_state try_mac;
        if (copy) {
            out = malloc(hh.length ? hh.length : 1);
            if (!out) {
                rpl_slot_unpin(s, sl);
                return REPLICA_IO;
            }
            crc = crc32c_copy(0, out, sl->data, hh.length);
        } else {
            if (mac) try_mac = *mac; /* initialized: each candidate starts from it */
            for (uint64_t off = 0; off < hh.length; off += VERIFY_CHUNK) {
                size_t n = hh.length - off < VERIFY_CHUNK ? (size_t)(hh.length - off) : VERIFY_CHUNK;
                crc = crc32c(crc, sl->data + off, n);
                if (mac) crypto_onetimeauth_update(&try_mac, sl->data + off, n);
            }
        }
        if (crc == hh.crc) {
            *h = hh;
            if (copy) {
                rpl_slot_unpin(s, sl);
                *payload = out;
            } else {
                *pinned = sl;
                if (mac) *mac = try_mac;
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
    if (!s || rank < 0 || rank >= s->world) return REPLICA_NOT_FOUND;
    replica_status st = rpl_find_verified(s, rank, max_step, 1, h, payload, NULL, NULL);
    return st == REPLICA_IO ? REPLICA_NOT_FOUND : st; /* out of memory: nothing to hand out */
}

void replica_server_corrupt_rank(ReplicaServer *s, int rank) {
    pthread_mutex_lock(&s->mu);
    s->corrupt_rank = rank;
    pthread_mutex_unlock(&s->mu);
}

int replica_server_debug_flip(ReplicaServer *s, int rank, int64_t step, uint64_t offset) {
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    Owner *o = rpl_owner_find(s, rank, 0);
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
        /* non-blocking: the accept thread accepts in bursts until the backlog is empty */
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
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

/* Half the memory this process may use (the physical memory, or the memory limit of its
 * cgroup when that is lower): the default budget of a holder's slots. */
static uint64_t default_max_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 2 * REPLICA_MAX_PAYLOAD;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* cgroup v2; "max" when unlimited */
    unsigned long long limit;
    if (f) {
        if (fscanf(f, "%llu", &limit) == 1 && limit > 0 && limit < mem) mem = limit;
        fclose(f);
    }
    return mem / 2;
}

ReplicaServer *replica_server_start(const char *bind_host, int port, const char *job, int world, long proc,
                                    const unsigned char key[REPLICA_KEY_BYTES], char *err, size_t errlen) {
    if (!job || !*job) {
        set_err(err, errlen, "replica server: empty job name");
        return NULL;
    }
    if (world < 1 || world > REPLICA_MAX_RANK) {
        set_err(err, errlen, "replica server: world size %d out of range", world);
        return NULL;
    }
    if (!key || sodium_init() < 0) {
        set_err(err, errlen, "replica server: no channel key, or libsodium cannot start");
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
    s->self_known = rpl_pull_identity(&s->self) == 0;
    s->corrupt_rank = -1;
    /* Truncated exactly as snprintf into SnapHeader.job truncates it, so names compare equal. */
    snprintf(s->job, sizeof s->job, "%s", job);
    s->world = world;
    memcpy(s->key, key, REPLICA_KEY_BYTES);
    s->max_bytes = default_max_bytes();
    s->wake[0] = s->wake[1] = -1;
    s->listen_fd = listen_on(bind_host, port, err, errlen);
    if (s->listen_fd < 0) goto fail;
    s->port = bound_port(s->listen_fd);
    rpl_holder_id(s->id, proc, bind_host, s->port);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        set_err(err, errlen, "replica server: pipe: %s", strerror(errno));
        goto fail;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* rpl_wait_put_slot's deadline */
    pthread_cond_init(&s->slot_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->accept_thread, NULL, rpl_accept_main, s) != 0) {
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
    sodium_memzero(s->key, sizeof s->key);
    free(s);
    return NULL;
}

int replica_server_port(const ReplicaServer *s) { return s ? s->port : -1; }

const unsigned char *replica_server_key(const ReplicaServer *s) { return s ? s->key : NULL; }

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
    rpl_join_conns(conns);

    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free_owners(s);
    pthread_cond_destroy(&s->slot_cv);
    pthread_mutex_destroy(&s->mu);
    sodium_memzero(s->key, sizeof s->key);
    free(s);
}
