/* replica_client.c — the channel's client end: connecting to a holder (the handshake from
 * the client's side), PUT, PULL and GET requests, their replies verified. */
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
            int ev = rpl_wait_fd(fd, POLLOUT, b);
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
    rpl_tune_socket(fd);
    return fd;
}

/* Connects c to its holder and authenticates, within the bound: REPLICA_OK (c->fd set),
 * REPLICA_IO or REPLICA_AUTH (+ err; c->fd stays -1). */
static replica_status conn_open(ReplicaConn *c, io_bound *b, char *err, size_t errlen) {
    int fd = connect_bounded(c->host, c->port, b, err, errlen);
    if (fd < 0) return REPLICA_IO;
    replica_status st = rpl_handshake_client(fd, c->key, c->id, &c->ss, b, err, errlen);
    if (st != REPLICA_OK) {
        close(fd);
        return st;
    }
    c->fd = fd;
    return REPLICA_OK;
}

ReplicaConn *replica_connect(const char *host, int port, long proc, int timeout_ms, int allow_pull,
                             const unsigned char key[REPLICA_KEY_BYTES], char *err, size_t errlen) {
    if (!host || strlen(host) >= sizeof(((ReplicaConn *)0)->host) || port <= 0 || port > 65535) {
        set_err(err, errlen, "replica: bad holder address %s:%d", host ? host : "(null)", port);
        return NULL;
    }
    if (!key || sodium_init() < 0) {
        set_err(err, errlen, "replica: no channel key, or libsodium cannot start");
        return NULL;
    }
    ReplicaConn *c = calloc(1, sizeof *c);
    if (!c) {
        set_err(err, errlen, "replica: out of memory");
        return NULL;
    }
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    rpl_holder_id(c->id, proc, host, port);
    c->fd = -1;
    memcpy(c->key, key, REPLICA_KEY_BYTES);
    c->pull = allow_pull && rpl_pull_identity(&c->me) == 0;
    /* Where the kernel restricts reading a process to its ancestors (Yama ptrace_scope 1),
     * let our holders, which are siblings, read us. */
    if (c->pull) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    io_bound b = rpl_bound_total(timeout_ms);
    if (conn_open(c, &b, err, errlen) != REPLICA_OK) {
        sodium_memzero(c->key, sizeof c->key);
        free(c);
        return NULL;
    }
    return c;
}

void replica_close(ReplicaConn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    sodium_memzero(c, sizeof *c);
    free(c);
}

/* After a failure the byte stream is out of step: drop it, the next call reconnects. */
static void conn_drop(ReplicaConn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Makes sure there is a usable, authenticated connection. An idle connection the holder has
 * closed reads as "ready" (EOF), and nothing else may arrive between requests, so a readable
 * socket is replaced before use. REPLICA_OK, REPLICA_IO or REPLICA_AUTH. */
static replica_status conn_ready(ReplicaConn *c, io_bound *b) {
    if (c->fd >= 0) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) conn_drop(c);
    }
    if (c->fd >= 0) return REPLICA_OK;
    char err[256];
    replica_status st = conn_open(c, b, err, sizeof err);
    if (st == REPLICA_AUTH) log_msg("%s (%s:%d)", err, c->host, c->port);
    return st;
}

/* Reads a tagged reply: int32 status, and when it is REPLICA_OK and h is given, the header
 * after it. 0, or -1 (I/O, or a tag that fails). */
static int recv_reply(ReplicaConn *c, int32_t *st, SnapHeader *h, io_bound *b) {
    unsigned char msg[sizeof(int32_t) + sizeof(SnapHeader)];
    size_t len = sizeof *st;
    if (rpl_recv_all(c->fd, msg, sizeof *st, b, NULL) != 0) return -1;
    memcpy(st, msg, sizeof *st);
    if (*st == REPLICA_OK && h) {
        if (rpl_recv_all(c->fd, msg + len, sizeof *h, b, NULL) != 0) return -1;
        len += sizeof *h;
    }
    if (rpl_recv_tag(c->fd, &c->ss, msg, len, b) != 0) {
        log_msg("replica: a reply with a bad MAC from %s:%d; connection dropped", c->host, c->port);
        return -1;
    }
    if (h && *st == REPLICA_OK) memcpy(h, msg + sizeof *st, sizeof *h);
    return 0;
}

/* Sends a whole request (type byte first) with its tag and reads the holder's status. OK and
 * `keeps` (a second status after which the connection stays usable) are returned as they
 * are; after anything else the connection is dropped: REFUSED, or IO for a broken or
 * nonsensical reply. */
static replica_status request_status(ReplicaConn *c, const void *req, size_t len, replica_status keeps, io_bound *b) {
    int32_t st;
    if (rpl_send_msg(c->fd, &c->ss, req, len, b) != 0 || recv_reply(c, &st, NULL, b) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_OK || st == (int32_t)keeps) return (replica_status)st;
    conn_drop(c);
    return st == REPLICA_REFUSED ? REPLICA_REFUSED : REPLICA_IO;
}

/* Asks the holder to pull the payload out of our memory. OK, REFUSED, NO_PULL or IO. Without
 * crc_known the holder computes the payload's CRC as it copies and *h gets it from the
 * holder's (tagged) answer: the header the holder now stores, which must be ours but for it. */
static replica_status put_by_pull(ReplicaConn *c, SnapHeader *h, const void *payload, int crc_known, io_bound *b) {
    unsigned char req[1 + sizeof(SnapHeader) + sizeof(PullSource)];
    PullSource src = c->me;
    src.addr = (uint64_t)(uintptr_t)payload;
    src.crc_known = crc_known ? 1 : 0;
    req[0] = REPLICA_REQ_PULL;
    memcpy(req + 1, h, sizeof *h);
    memcpy(req + 1 + sizeof *h, &src, sizeof src);
    int32_t st;
    SnapHeader stored;
    if (rpl_send_msg(c->fd, &c->ss, req, sizeof req, b) != 0 || recv_reply(c, &st, &stored, b) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_NO_PULL) return REPLICA_NO_PULL;
    if (st != REPLICA_OK) {
        conn_drop(c);
        return st == REPLICA_REFUSED ? REPLICA_REFUSED : REPLICA_IO;
    }
    SnapHeader mine = *h;
    mine.crc = stored.crc;
    snap_header_seal(&mine);
    if (memcmp(&mine, &stored, sizeof mine) != 0 || (crc_known && stored.crc != h->crc)) {
        log_msg("replica: %s:%d stored a header other than ours; connection dropped", c->host, c->port);
        conn_drop(c);
        return REPLICA_IO;
    }
    *h = stored;
    return REPLICA_OK;
}

replica_status replica_reserve(ReplicaConn *c, const SnapHeader *h, int timeout_ms) {
    if (!c || !h) return REPLICA_IO;
    io_bound b = rpl_bound_total(timeout_ms);
    replica_status ready = conn_ready(c, &b);
    if (ready != REPLICA_OK) return ready;
    unsigned char req[1 + sizeof(SnapHeader)];
    req[0] = REPLICA_REQ_RESERVE;
    memcpy(req + 1, h, sizeof *h);
    return request_status(c, req, sizeof req, REPLICA_OK, &b);
}

int replica_last_put_pulled(const ReplicaConn *c) { return c && c->last_pulled; }

static replica_status put_generation(ReplicaConn *c, SnapHeader *h, const void *payload, int crc_known, int timeout_ms) {
    if (!c || !h || (h->length > 0 && !payload)) return REPLICA_IO;
    io_bound b = rpl_bound_total(bound_for_bytes_ms(timeout_ms, h->length)); /* a bigger state takes longer */
    replica_status ready = conn_ready(c, &b);
    if (ready != REPLICA_OK) return ready;
    c->last_pulled = 0;
    if (c->pull && h->length > 0) {
        replica_status st = put_by_pull(c, h, payload, crc_known, &b);
        if (st != REPLICA_NO_PULL) {
            c->last_pulled = st == REPLICA_OK;
            return st;
        }
        c->pull = 0; /* this holder cannot read us: TCP from now on */
    }
    if (!crc_known) { /* TCP: the holder checks the bytes it receives against the header */
        h->crc = crc32c(0, payload, h->length);
        snap_header_seal(h);
    }

    unsigned char head[1 + sizeof(SnapHeader)];
    head[0] = REPLICA_REQ_PUT;
    memcpy(head + 1, h, sizeof *h);
    int sent = rpl_send_msg(c->fd, &c->ss, head, sizeof head, &b) == 0 ? 0 : -1;
    if (sent == 0) {
        crypto_onetimeauth_state mac;
        unsigned char tag[PAYLOAD_TAG_BYTES];
        rpl_payload_mac_init(&mac, &c->ss, c->ss.tx_dir, c->ss.tx_seq - 1); /* the payload of the request just sent */
        sent = rpl_send_bytes(c->fd, payload, h->length, &b, 1, &mac);
        crypto_onetimeauth_final(&mac, tag);
        if (sent == 0 && rpl_send_all(c->fd, tag, sizeof tag, &b) != 0) sent = -1;
    }
    int32_t st;
    /* sent == 1: the holder answered early (a refusal) before taking the whole payload */
    if (sent < 0 || recv_reply(c, &st, NULL, &b) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_OK && sent == 0) return REPLICA_OK;
    conn_drop(c); /* after a refusal the holder may have closed: start clean next time */
    return st == REPLICA_REFUSED ? REPLICA_REFUSED : REPLICA_IO;
}

replica_status replica_put(ReplicaConn *c, const SnapHeader *h, const void *payload, int timeout_ms) {
    SnapHeader copy = *h;
    return put_generation(c, &copy, payload, 1, timeout_ms);
}

replica_status replica_put_summing(ReplicaConn *c, SnapHeader *h, const void *payload, int timeout_ms) {
    return put_generation(c, h, payload, 0, timeout_ms);
}

replica_status replica_get(ReplicaConn *c, const char *job, int rank, int64_t max_step, SnapHeader *h,
                           void **payload, int timeout_ms) {
    return replica_get_into(c, job, rank, max_step, h, NULL, NULL, payload, timeout_ms);
}

replica_status replica_get_into(ReplicaConn *c, const char *job, int rank, int64_t max_step, SnapHeader *h,
                                void *(*place)(void *arg, uint64_t length), void *arg, void **payload, int timeout_ms) {
    if (payload) *payload = NULL;
    if (!c || !job || !h || !payload) return REPLICA_IO;
    io_bound b = rpl_bound_total(timeout_ms);
    replica_status ready = conn_ready(c, &b);
    if (ready != REPLICA_OK) return ready;

    unsigned char req[1 + GET_REQ_LEN];
    memset(req, 0, sizeof req);
    req[0] = REPLICA_REQ_GET;
    snprintf((char *)req + 1, JOB_LEN, "%s", job); /* truncated like SnapHeader.job */
    int32_t r32 = rank;
    memcpy(req + 1 + JOB_LEN, &r32, sizeof r32);
    memcpy(req + 1 + JOB_LEN + sizeof r32, &max_step, sizeof max_step);
    int32_t st;
    SnapHeader got;
    uint64_t reply_seq = c->ss.rx_seq; /* its payload's MAC key depends on it */
    if (rpl_send_msg(c->fd, &c->ss, req, sizeof req, &b) != 0 || recv_reply(c, &st, &got, &b) != 0) {
        conn_drop(c);
        return REPLICA_IO;
    }
    if (st == REPLICA_NOT_FOUND || st == REPLICA_CORRUPT) return (replica_status)st;
    if (st != REPLICA_OK) {
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
    b = rpl_bound_total(bound_for_bytes_ms(timeout_ms, got.length)); /* the payload: as long as its bytes take */
    unsigned char *into = place ? place(arg, got.length) : NULL;
    int own = into == NULL;
    unsigned char *buf = own ? malloc(got.length ? got.length : 1) : into;
    if (!buf) {
        conn_drop(c);
        return REPLICA_IO;
    }
    uint32_t crc = 0;
    crypto_onetimeauth_state mac;
    rpl_payload_mac_init(&mac, &c->ss, c->ss.rx_dir, reply_seq);
    if (rpl_recv_bytes(c->fd, buf, got.length, &b, &crc, &mac) != 0) {
        if (own) free(buf);
        sodium_memzero(&mac, sizeof mac);
        conn_drop(c);
        return REPLICA_IO;
    }
    if (rpl_recv_payload_tag(c->fd, &mac, &b) != 0) {
        /* not the bytes the holder sent (its CRC may match: anybody can fix that up): none is used */
        if (own) free(buf);
        log_msg("replica: rank %d's state from %s:%d failed its MAC (altered on the way); refused", rank, c->host,
                c->port);
        conn_drop(c);
        return REPLICA_AUTH;
    }
    if (crc != got.crc) { /* the holder's memory changed the bytes it had verified; the stream is in step */
        if (own) free(buf);
        return REPLICA_CORRUPT;
    }
    *h = got;
    *payload = buf;
    return REPLICA_OK;
}

int replica_server_newest(ReplicaServer *s, int rank, int64_t *step, int64_t *epoch) {
    int found = -1;
    if (!s || rank < 0 || rank >= s->world) return -1;
    pthread_mutex_lock(&s->mu);
    Owner *o = rpl_owner_find(s, rank, 0);
    for (int i = 0; o && i < 2; i++) {
        const Slot *sl = &o->slot[i];
        if (!sl->valid || (found == 0 && sl->h.step <= *step)) continue;
        *step = sl->h.step;
        *epoch = sl->h.epoch;
        found = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}
