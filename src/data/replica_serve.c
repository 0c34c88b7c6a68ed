/* replica_serve.c — a holder's connections: the accept thread, which runs every waiting
 * connection's handshake (replica_handshake.h) and gives each one that proves the job's key
 * a thread, and that thread serving it: PUT (a generation into a slot, verified as it
 * arrives), PULL (read from the owner's memory on the same machine), GET (a generation back,
 * verified and tagged as it leaves), and the refusals. */
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
/* ------------------------------------------------------------------------------------- */
/* holder: serving one connection                                                         */
/* ------------------------------------------------------------------------------------- */

/* Sends a status (and, for GET, the header after it) as one tagged reply. 0, or -1. */
static int send_reply(Conn *c, replica_status st, const SnapHeader *h, io_bound *b) {
    unsigned char msg[sizeof(int32_t) + sizeof(SnapHeader)];
    int32_t v = (int32_t)st;
    memcpy(msg, &v, sizeof v);
    if (h) memcpy(msg + sizeof v, h, sizeof *h);
    return rpl_send_msg(c->fd, &c->ss, msg, sizeof v + (h ? sizeof *h : 0), b);
}

/* Reads the rest of a request whose type byte is req[0]: req[1..len), then its tag. 0, or -1
 * (I/O, or a tag that fails: the connection is closed without acting on it). */
static int recv_request(Conn *c, unsigned char *req, size_t len, io_bound *b) {
    if (rpl_recv_all(c->fd, req + 1, len - 1, b, NULL) != 0) return -1;
    if (rpl_recv_tag(c->fd, &c->ss, req, len, b) == 0) return 0;
    log_msg("replica: a request with a bad MAC; connection closed");
    return -1;
}

/* Refuses a PUT before its payload: the verdict, a half-close, then input is discarded for
 * a moment so the sender reads the verdict instead of a connection reset. */
static void refuse_early(Conn *c) {
    io_bound b = rpl_bound_stall(REFUSE_DRAIN_MS);
    if (send_reply(c, REPLICA_REFUSED, NULL, &b) != 0) return;
    shutdown(c->fd, SHUT_WR);
    b = rpl_bound_total(REFUSE_DRAIN_MS);
    char sink[65536];
    while (rpl_wait_fd(c->fd, POLLIN, &b) > 0) {
        ssize_t r = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return;
    }
}

/* What makes a PUT header unacceptable to this holder, or NULL. */
static const char *put_header_problem(ReplicaServer *s, const SnapHeader *h) {
    const char *bad = snap_header_check(h);
    if (bad) return bad;
    if (strncmp(h->job, s->job, sizeof h->job) != 0) return "snapshot of another job";
    if (h->world != s->world) return "world size is not the job's"; /* and rank < world: checked above */
    pthread_mutex_lock(&s->mu);
    uint64_t budget = s->max_bytes;
    pthread_mutex_unlock(&s->mu);
    if (h->length > budget) return "payload larger than the holder's budget";
    if (h->epoch < __atomic_load_n(&s->min_epoch, __ATOMIC_ACQUIRE)) return "snapshot from a fenced epoch";
    return NULL;
}

void replica_server_set_min_epoch(ReplicaServer *s, int64_t epoch) {
    __atomic_store_n(&s->min_epoch, epoch, __ATOMIC_RELEASE);
}

void replica_server_set_max_bytes(ReplicaServer *s, uint64_t bytes) {
    pthread_mutex_lock(&s->mu);
    s->max_bytes = bytes;
    pthread_mutex_unlock(&s->mu);
}

/* The slot a new generation of h->rank goes into, marked busy with room for its payload, or
 * NULL (no slot free in time, over budget, no memory, stopping). */
static Slot *take_put_slot(ReplicaServer *s, const SnapHeader *h) {
    pthread_mutex_lock(&s->mu);
    Owner *o = rpl_owner_find(s, h->rank, 1);
    int idx = o ? rpl_wait_put_slot(s, o) : -1;
    if (idx < 0) {
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    Slot *sl = &o->slot[idx];
    sl->valid = 0; /* from here on its old contents are gone */
    sl->busy = 1;
    pthread_mutex_unlock(&s->mu);
    if (rpl_slot_reserve(s, sl, h->length) != 0) {
        rpl_slot_finish_put(s, sl, NULL);
        return NULL;
    }
    return sl;
}

/* Whether pid is the process at the other end of this connection (see the file comment).
 * Remembered for the connection once proved. */
static int pull_source_is_peer(Conn *c, int64_t pid) {
    if (c->peer_pid > 0 && c->peer_pid == pid) return 1;
    unsigned long inode = rpl_peer_socket_inode(c->fd);
    if (inode && rpl_process_has_socket(pid, inode)) {
        c->peer_pid = pid;
        return 1;
    }
    if (!c->peer_warned) {
        c->peer_warned = 1;
        if (inode)
            log_msg("replica: refused to pull from process %lld: it is not the one at the other end of the connection",
                    (long long)pid);
        else
            log_msg("replica: cannot tell which process is at the other end of a connection (another network "
                    "namespace?): its snapshots come over TCP");
    }
    return 0;
}

/* One PULL (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_pull(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + sizeof(SnapHeader) + sizeof(PullSource)] = {REPLICA_REQ_PULL};
    SnapHeader h;
    PullSource src;
    io_bound b = rpl_bound_stall(SERVER_STALL_MS);
    if (recv_request(c, req, sizeof req, &b) != 0) return 0;
    memcpy(&h, req + 1, sizeof h);
    memcpy(&src, req + 1 + sizeof h, sizeof src);
    if (put_header_problem(s, &h)) return send_reply(c, REPLICA_REFUSED, NULL, &b) == 0;
    src.boot_id[sizeof src.boot_id - 1] = 0;
    if (!s->self_known || strcmp(s->self.boot_id, src.boot_id) != 0 || s->self.pidns != src.pidns ||
        !pull_source_is_peer(c, src.pid))
        return send_reply(c, REPLICA_NO_PULL, NULL, &b) == 0;
    Slot *sl = take_put_slot(s, &h);
    if (!sl) return send_reply(c, REPLICA_REFUSED, NULL, &b) == 0;
    uint32_t crc = 0;
    int good = rpl_pull_bytes(&src, sl->data, h.length, &crc) == 0 && (!src.crc_known || crc == h.crc);
    if (good && !src.crc_known) { /* the owner's bytes cannot change before our verdict: this is their CRC */
        h.crc = crc;
        snap_header_seal(&h);
    }
    rpl_slot_finish_put(s, sl, good ? &h : NULL);
    return send_reply(c, good ? REPLICA_OK : REPLICA_NO_PULL, good ? &h : NULL, &b) == 0;
}

/* One RESERVE (the type byte already read). 1 to keep serving the connection, 0 to close it.
 * A slot is only taken while it is free in every sense (no generation, no PUT, no reader),
 * and marked busy meanwhile, so a PUT arriving during the page faults waits for it. */
static int serve_reserve(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + sizeof(SnapHeader)] = {REPLICA_REQ_RESERVE};
    SnapHeader h;
    io_bound b = rpl_bound_stall(SERVER_STALL_MS);
    if (recv_request(c, req, sizeof req, &b) != 0) return 0;
    memcpy(&h, req + 1, sizeof h);
    if (put_header_problem(s, &h)) return send_reply(c, REPLICA_REFUSED, NULL, &b) == 0;
    int refused = 0;
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&s->mu);
        Owner *o = rpl_owner_find(s, h.rank, 1);
        Slot *sl = o ? &o->slot[i] : NULL;
        int take = sl && !sl->valid && !sl->busy && sl->readers == 0 && sl->cap < h.length;
        if (take) sl->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (!take) continue;
        if (rpl_slot_reserve(s, sl, h.length) == 0) prefault(sl->data, h.length);
        else refused = 1;
        rpl_slot_finish_put(s, sl, NULL);
    }
    b = rpl_bound_stall(SERVER_STALL_MS);
    return send_reply(c, refused ? REPLICA_REFUSED : REPLICA_OK, NULL, &b) == 0;
}

/* One PUT (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_put(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + sizeof(SnapHeader)] = {REPLICA_REQ_PUT};
    SnapHeader h;
    io_bound b = rpl_bound_stall(SERVER_STALL_MS);
    if (recv_request(c, req, sizeof req, &b) != 0) return 0;
    memcpy(&h, req + 1, sizeof h);
    if (put_header_problem(s, &h)) {
        refuse_early(c);
        return 0;
    }

    Slot *sl = take_put_slot(s, &h);
    if (!sl) {
        refuse_early(c);
        return 0;
    }
    uint32_t crc = 0;
    crypto_onetimeauth_state mac;
    rpl_payload_mac_init(&mac, &c->ss, c->ss.rx_dir, c->ss.rx_seq - 1); /* the payload of the request just read */
    b = rpl_bound_stall(SERVER_STALL_MS);
    if (rpl_recv_bytes(c->fd, sl->data, h.length, &b, &crc, &mac) != 0) {
        rpl_slot_finish_put(s, sl, NULL); /* sender gone mid-payload: the other slot is untouched */
        return 0;
    }
    if (rpl_recv_payload_tag(c->fd, &mac, &b) != 0) {
        /* altered on the way (the CRC may well match: anybody can fix it up): never stored */
        rpl_slot_finish_put(s, sl, NULL);
        log_msg("replica: the payload of a PUT of rank %d step %lld failed its MAC; refused, connection closed",
                h.rank, (long long)h.step);
        send_reply(c, REPLICA_REFUSED, NULL, &b);
        return 0;
    }
    int good = crc == h.crc;
    rpl_slot_finish_put(s, sl, good ? &h : NULL);
    return send_reply(c, good ? REPLICA_OK : REPLICA_REFUSED, NULL, &b) == 0;
}

/* One GET (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_get(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + GET_REQ_LEN] = {REPLICA_REQ_GET};
    io_bound b = rpl_bound_stall(SERVER_STALL_MS);
    if (recv_request(c, req, sizeof req, &b) != 0) return 0;
    char job[JOB_LEN];
    int32_t rank;
    int64_t max_step;
    memcpy(job, req + 1, JOB_LEN);
    memcpy(&rank, req + 1 + JOB_LEN, sizeof rank);
    memcpy(&max_step, req + 1 + JOB_LEN + sizeof rank, sizeof max_step);

    SnapHeader h;
    Slot *sl = NULL;
    replica_status st = REPLICA_NOT_FOUND;
    crypto_onetimeauth_state mac;
    rpl_payload_mac_init(&mac, &c->ss, c->ss.tx_dir, c->ss.tx_seq); /* the payload of the reply sent next */
    int job_ok = memchr(job, '\0', sizeof job) && strncmp(job, s->job, sizeof job) == 0;
    if (job_ok && rank >= 0 && rank < s->world) st = rpl_find_verified(s, rank, max_step, 0, &h, NULL, &sl, &mac);
    if (st != REPLICA_OK) {
        sodium_memzero(&mac, sizeof mac);
        return send_reply(c, st, NULL, &b) == 0;
    }

    /* Sent straight from the pinned slot: no second copy of a possibly huge payload. A PUT
     * that needs this slot waits until the send ends (bounded by the stall limit). The tag
     * was computed by the verifying pass; should the bytes change before they go out (a
     * memory fault), the client refuses them. */
    unsigned char tag[PAYLOAD_TAG_BYTES];
    crypto_onetimeauth_final(&mac, tag);
    int rc = send_reply(c, REPLICA_OK, &h, &b) == 0 && rpl_send_all(c->fd, sl->data, h.length, &b) == 0 &&
             rpl_send_all(c->fd, tag, sizeof tag, &b) == 0;
    rpl_slot_unpin(s, sl);
    return rc;
}

static void *conn_main(void *arg) {
    Conn *c = arg;
    pthread_setname_np(pthread_self(), "dp-holder");
    ReplicaServer *s = c->srv;
    /* The accept thread started us once the peer proved it holds the job's key (c->ss). */
    for (;;) {
        unsigned char type;
        io_bound idle = rpl_bound_none(); /* an idle connection may wait for its next request */
        if (rpl_recv_all(c->fd, &type, 1, &idle, NULL) != 0) break;
        int keep = 0;
        double cpu0 = thread_cpu_ms();
        if (type == REPLICA_REQ_PUT) keep = serve_put(s, c);
        else if (type == REPLICA_REQ_GET) keep = serve_get(s, c);
        else if (type == REPLICA_REQ_PULL) keep = serve_pull(s, c);
        else if (type == REPLICA_REQ_RESERVE) keep = serve_reserve(s, c);
        if (type == REPLICA_REQ_PUT || type == REPLICA_REQ_PULL) {
            double used = thread_cpu_ms() - cpu0;
            pthread_mutex_lock(&s->mu);
            s->put_cpu_ms += used;
            pthread_mutex_unlock(&s->mu);
        }
        if (!keep) break; /* unknown request type: the stream cannot be trusted */
    }
    sodium_memzero(&c->ss, sizeof c->ss);
    pthread_mutex_lock(&s->mu);
    c->done = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Joins each connection's thread, then closes its socket and frees it. */
void rpl_join_conns(Conn *list) {
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
            s->n_conns--;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    rpl_join_conns(done);
}

/* A connection that proved the key (session ss): its own thread serves its requests. */
static void start_conn(ReplicaServer *s, int fd, const Session *ss) {
    Conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->ss = *ss;
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping && pthread_create(&c->thread, NULL, conn_main, c) == 0;
    if (ok) {
        c->next = s->conns;
        s->conns = c;
        s->n_conns++;
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        close(fd);
        free(c);
    }
}

void replica_hs_start(ReplicaHandshake *h, const unsigned char nh[NONCE_BYTES]) {
    memset(h, 0, sizeof *h);
    memcpy(h->hello, HELLO_MAGIC, 4);
    memcpy(h->hello + 4, nh, NONCE_BYTES);
    h->verdict = REPLICA_HS_MORE;
}

size_t replica_hs_want(const ReplicaHandshake *h) {
    return h->verdict == REPLICA_HS_MORE ? sizeof h->answer - h->got : 0;
}

replica_hs_verdict replica_hs_feed(ReplicaHandshake *h, const unsigned char *key, const char *id, const void *in,
                                   size_t n, size_t *used, ReplicaHsAccept *out) {
    *used = 0;
    if (h->verdict != REPLICA_HS_MORE) return h->verdict;
    if (n == 0) {
        h->verdict = REPLICA_HS_REFUSE;
        h->why = "the peer closed the connection before its answer to the hello was complete";
        return h->verdict;
    }
    size_t k = replica_hs_want(h);
    if (n < k) k = n;
    memcpy(h->answer + h->got, in, k);
    h->got += k;
    *used = k;
    if (h->got < sizeof h->answer) return REPLICA_HS_MORE; /* more to come */
    const unsigned char *nh = h->hello + 4, *nc = h->answer;
    /* another job's key, or a client that meant another holder (relayed to us): refused at once,
     * so a client of the job that meant another holder tries the next one without waiting */
    if (rpl_verify_label(h->answer + NONCE_BYTES, key, "DPrepl02 client", nh, nc, id) != 0) {
        h->verdict = REPLICA_HS_REFUSE;
        h->why = "the client's proof does not hold for this holder's key and identity (another job's key, or a "
                 "client that meant another holder)";
        return h->verdict;
    }
    rpl_mac_label(out->proof, key, "DPrepl02 holder", nh, nc, id);
    rpl_mac_label(out->ks, key, "DPrepl02 session", nh, nc, id);
    h->verdict = REPLICA_HS_ACCEPT;
    return h->verdict;
}

/* Accepts a connection into pending (closing the oldest waiting one when every entry is taken)
 * and sends the hello. 1 accepted, 0 nothing to accept, -1 out of descriptors or memory. */
static int accept_pending(ReplicaServer *s, Pending *pending, int cap, uint64_t *order) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ? 0 : -1;
    rpl_tune_socket(fd);
    Pending *slot = NULL;
    for (int i = 0; i < cap; i++) {
        if (pending[i].fd < 0) { slot = &pending[i]; break; }
        if (!slot || pending[i].order < slot->order) slot = &pending[i];
    }
    if (slot->fd >= 0) close(slot->fd); /* the oldest stranger makes room */
    slot->fd = fd;
    slot->deadline = rpl_mono_ms() + HANDSHAKE_MS;
    slot->order = ++*order;
    unsigned char nh[NONCE_BYTES];
    randombytes_buf(nh, sizeof nh);
    replica_hs_start(&slot->hs, nh);
    /* a fresh socket's send buffer takes 36 bytes at once; anything else is no client of ours */
    if (send(fd, slot->hs.hello, sizeof slot->hs.hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof slot->hs.hello) {
        close(fd);
        slot->fd = -1;
    }
    return 1;
}

/* Reads what a waiting connection sent (never past its answer: what follows is the first
 * request, the connection thread's); once its proof is complete and right, answers it and hands
 * the connection to a thread of its own. The entry is freed when done or failed. */
static void advance_pending(ReplicaServer *s, Pending *p) {
    unsigned char buf[REPLICA_ANSWER_BYTES];
    ssize_t r = recv(p->fd, buf, replica_hs_want(&p->hs), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    int fd = p->fd;
    p->fd = -1;
    if (r < 0) {
        close(fd);
        return;
    }
    size_t used;
    ReplicaHsAccept acc;
    replica_hs_verdict v = replica_hs_feed(&p->hs, s->key, s->id, buf, (size_t)r, &used, &acc);
    if (v == REPLICA_HS_MORE) {
        p->fd = fd;
        return;
    }
    if (v != REPLICA_HS_ACCEPT) { /* refused: closed at once */
        close(fd);
        return;
    }
    if (send(fd, acc.proof, sizeof acc.proof, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof acc.proof) {
        close(fd);
        sodium_memzero(&acc, sizeof acc);
        return;
    }
    Session ss;
    rpl_session_keyed(&ss, acc.ks, 1);
    sodium_memzero(&acc, sizeof acc);
    start_conn(s, fd, &ss);
    sodium_memzero(&ss, sizeof ss);
}

void *rpl_accept_main(void *arg) {
    ReplicaServer *s = arg;
    pthread_setname_np(pthread_self(), "dp-holder-acc");
    /* waiting connections hold descriptors: a quarter of the process's at most */
    int cap = MAX_HANDSHAKING;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < (rlim_t)cap)
        cap = rl.rlim_cur / 4 < 16 ? 16 : (int)(rl.rlim_cur / 4);
    Pending *pending = calloc((size_t)cap, sizeof *pending);
    struct pollfd *p = calloc((size_t)cap + 2, sizeof *p);
    int *map = calloc((size_t)cap, sizeof *map);
    if (!pending || !p || !map) {
        log_msg("replica server: out of memory: no connection is accepted");
        free(pending), free(p), free(map);
        return NULL;
    }
    uint64_t order = 0;
    for (int i = 0; i < cap; i++) pending[i].fd = -1;
    for (;;) {
        /* Connections that proved the key are limited (MAX_CONNS: then new ones wait in the
         * listen backlog); strangers are not let in by that door at all (see the file comment). */
        pthread_mutex_lock(&s->mu);
        int full = s->n_conns >= MAX_CONNS;
        pthread_mutex_unlock(&s->mu);
        int np = 2;
        p[0] = (struct pollfd){.fd = full ? -1 : s->listen_fd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        int64_t now = rpl_mono_ms(), next = now + (full ? 5 : 1000); /* the timeout also paces reaping */
        for (int i = 0; i < cap; i++) {
            if (pending[i].fd < 0) continue;
            if (pending[i].deadline <= now) { /* no proof in time */
                close(pending[i].fd);
                pending[i].fd = -1;
                continue;
            }
            if (pending[i].deadline < next) next = pending[i].deadline;
            map[np - 2] = i;
            p[np++] = (struct pollfd){.fd = pending[i].fd, .events = POLLIN};
        }
        int r = poll(p, (nfds_t)np, (int)(next - now) + 1);
        if (r < 0 && errno != EINTR) break;
        if (r > 0 && p[1].revents) break;
        reap_done_conns(s);
        if (r <= 0) continue;
        for (int k = 2; k < np; k++)
            if (p[k].revents) advance_pending(s, &pending[map[k - 2]]);
        if (p[0].revents & POLLIN) {
            int a = 0;
            for (int n = 0; n < ACCEPT_BURST && (a = accept_pending(s, pending, cap, &order)) == 1; n++) {
            }
            /* out of descriptors or memory: back off instead of spinning on a ready socket */
            if (a < 0) sleep_ms(10);
        }
    }
    for (int i = 0; i < cap; i++)
        if (pending[i].fd >= 0) close(pending[i].fd);
    free(pending), free(p), free(map);
    return NULL;
}
