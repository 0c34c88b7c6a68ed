/* replica.c — the replication channel: a holder keeps other ranks' per-iteration snapshots in
 * host memory (two generations per owner rank) and serves them back over TCP.
 *
 * Wire protocol. One TCP connection carries a handshake, then any number of requests, one
 * after the other. Integers are in host byte order (every DeadPool host is x86-64, little
 * endian) and the SnapHeader travels as its 88 raw bytes (no padding, checked below).
 * K is the channel key: the launcher draws the job's secret (32 random bytes) and stores it in
 * the job's Redis config hash (readable only with the Redis password, which never appears on
 * a command line); every process derives K = crypto_kdf_derive_from_key(id 1, context
 * "DPrepl01", secret). MAC(k, m) is libsodium's crypto_auth (HMAC-SHA-512-256, 32 bytes),
 * always checked in constant time (crypto_auth_verify). No cryptography is made here.
 *
 * Handshake, once per connection (connections are long-lived: one per owner and holder):
 *   holder -> client: "DPR2", Nh (32 random bytes)
 *   client -> holder: Nc (32 random bytes), MAC(K, "DPrepl02 client" || Nh || Nc || I)
 *   holder -> client: MAC(K, "DPrepl02 holder" || Nh || Nc || I)
 * I is the holder's identity as the job records it (holders list, resume holder):
 * "PROC@HOST:PORT", PROC its process id in the job (0: a launcher), HOST and PORT where it
 * listens. The holder checks the client's proof against its own I, the client the holder's
 * against the I it meant. Every member of the job has K, so a proof of K alone would let a
 * process squatting a dead holder's port relay the handshake to a live holder (the same key)
 * and then rewrite what flows back: with I in both proofs a relay to any other holder fails
 * (the holder it reaches computes another I), and the squatter itself has no K. The holder
 * verifies the client's proof before it reads another byte and closes the connection when it
 * fails or does not arrive within HANDSHAKE_MS. Connections that have not proved the key yet
 * cannot crowd out those that do: the accept thread accepts every connection at once and
 * runs its handshake itself, non-blocking, beside all the others (a legitimate client answers
 * the hello at once, so its handshake is over in one round trip, however many strangers wait);
 * at most MAX_HANDSHAKING (fewer when the descriptor limit is low: a quarter of it) wait for
 * their proof, and a new connection beyond that closes the oldest waiting one: a stranger who
 * holds connections open only pushes out its own, and one who re-opens them as fast as it can
 * still leaves a client that many accepts (milliseconds) to answer the hello. Only a connection that proved the key gets a thread and counts against
 * MAX_CONNS. What the handshake decides (the answer taken as it arrives, in any pieces and never a
 * byte past it, checked, the proof and Ks made) is a pure state machine, replica_hs_feed
 * (replica_handshake.h): the accept thread only moves bytes between it and the socket, and
 * tests/fuzz/fuzz_replica_handshake.c drives it directly.
 * Both ends then use the session key Ks = MAC(K, "DPrepl02 session" || Nh || Nc || I).
 *
 * Messages. Every request and every reply below is followed by a 32-byte tag
 * MAC(Ks, dir || seq || message): dir is 'C' from the client, 'H' from the holder, seq (uint64)
 * counts the messages sent so far in that direction on this connection, so a message cannot be
 * replayed, reordered or moved to another connection. A message whose tag fails ends the
 * connection before anything is acted on. Covered by tags: request types, SnapHeaders (so the
 * payload's length and CRC32C), GET's arguments, PULL's PullSource, every status and GET's reply
 * header. A payload that crosses the wire (PUT, GET's reply) follows its tagged message and is
 * itself followed by a 16-byte Poly1305 tag (crypto_onetimeauth) under a key used for that
 * payload alone: crypto_kdf_derive_from_key(Ks, subkey id = seq of the message it follows,
 * context "DPpayC02" from the client, "DPpayH02" from the holder). The CRC32C stops accidents;
 * anybody can recompute it, so a payload is accepted only when its tag checks out too, before
 * the receiver acts on a byte of it. Poly1305 rather than a MAC like the messages': it is
 * computed piece by piece as the bytes go out or land, still in cache, at about 3.5 GB/s per
 * core here (HMAC or keyed BLAKE2b: under 0.6 GB/s). A PULL's payload never crosses a wire
 * (the holder copies it out of the owner's memory, see below), so the per-step path on one
 * machine pays nothing for it. Nothing is encrypted.
 *   PUT  request: 'P' (REPLICA_REQ_PUT), SnapHeader, tag; then header.length payload bytes and
 *                 their payload tag.
 *        reply:    int32 status, REPLICA_OK or REPLICA_REFUSED.
 *   GET  request: 'G' (REPLICA_REQ_GET), char job[40] (NUL-padded), int32 rank,
 *                 int64 max_step (< 0: newest).
 *        reply:    int32 status (+ SnapHeader when REPLICA_OK), tag; then, when REPLICA_OK,
 *                  header.length bytes and their payload tag. Otherwise REPLICA_NOT_FOUND or
 *                  REPLICA_CORRUPT.
 *   PULL request: 'L' (REPLICA_REQ_PULL), SnapHeader, then a PullSource (below): where in
 *        which process on this machine the payload lies, and whether the header's crc is
 *        computed (crc_known). When it is not (the owner's zero-copy generations), the
 *        holder computes it over the bytes it copies and stores the header with it: the
 *        sender blocks until the verdict, so those bytes are the sender's.
 *        reply:    int32 status (+ the SnapHeader as stored, when REPLICA_OK): REPLICA_OK,
 *                  REPLICA_REFUSED (bad header) or REPLICA_NO_PULL (another machine or pid
 *                  namespace, not permitted, or the bytes read did not match a known CRC):
 *                  the sender then PUTs the same generation, its CRC computed first.
 *        The holder pulls only from the process at the other end of this very connection:
 *        it asks the kernel's socket diagnostics (NETLINK_SOCK_DIAG, what `ss` uses) for the
 *        inode of the peer's socket and requires that /proc/PID/fd of the named pid holds it,
 *        and process_vm_readv makes its own permission check on top. So a client can only
 *        have its own memory read: PULL is no oracle into other processes. When the peer
 *        cannot be found (another network namespace) the answer is NO_PULL: TCP it is.
 *   RESERVE request: 'R' (REPLICA_REQ_RESERVE), SnapHeader (step unused): the owner's
 *        payload size, sent once when its snapshot engine starts.
 *        reply:    int32 status, REPLICA_OK or REPLICA_REFUSED (bad header, over budget).
 *        The holder allocates both of that owner's slots and faults their pages in before
 *        answering; slots holding a generation, or in use, are left alone.
 *        Same-machine replication this way (PULL) costs one copy (process_vm_readv, checksummed
 *        chunk by chunk while the chunk is in cache) instead of a send and a receive through
 *        the kernel's socket buffers. The sender blocks until the verdict, so its buffer does
 *        not change under the read.
 * Bounds. A header is accepted only for this job, its world size (the job's real one, given
 * at start) and a rank below it, from an epoch that is not fenced; every slot's bytes count
 * against the holder's budget (replica_server_set_max_bytes, default half the physical
 * memory or of the cgroup's limit), and a PUT, PULL or RESERVE that would exceed it is refused. Owners exist only for
 * real ranks, so nobody can make a holder allocate for made-up ones.
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
    case REPLICA_AUTH: return "the peer did not prove it holds the job's key and is the holder meant, or a payload failed its MAC";
    }
    return "unknown replica status";
}

/* ------------------------------------------------------------------------------------- */
/* bounded socket I/O                                                                     */
/* ------------------------------------------------------------------------------------- */

int64_t rpl_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Client calls: one deadline for the whole call. */
io_bound rpl_bound_total(int timeout_ms) {
    if (timeout_ms <= 0) timeout_ms = 1;
    return (io_bound){rpl_mono_ms() + timeout_ms, 0};
}

/* Holder: fail only when the peer stops making progress. */
io_bound rpl_bound_stall(int stall_ms) { return (io_bound){rpl_mono_ms() + stall_ms, stall_ms}; }

io_bound rpl_bound_none(void) { return (io_bound){INT64_MAX, 0}; }

static void bound_progress(io_bound *b) {
    if (b->stall_ms > 0) b->deadline = rpl_mono_ms() + b->stall_ms;
}

/* Waits until fd reports one of `events` (or an error/hangup). Returns the revents, 0 when
 * the bound expired, -1 on a poll failure. */
int rpl_wait_fd(int fd, short events, const io_bound *b) {
    for (;;) {
        int ms = -1;
        if (b->deadline != INT64_MAX) {
            int64_t left = b->deadline - rpl_mono_ms();
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
 * holder's early verdict). When mac is given, it is continued over each piece as it goes out
 * (still in cache). 0 all sent, 1 input is waiting, -1 failure or timeout. */
int rpl_send_bytes(int fd, const void *buf, size_t n, io_bound *b, int watch_input, crypto_onetimeauth_state *mac) {
    const unsigned char *p = buf;
    while (n > 0) {
        int ev = rpl_wait_fd(fd, watch_input ? (POLLOUT | POLLIN) : POLLOUT, b);
        if (ev <= 0) return -1;
        if (watch_input && (ev & POLLIN)) return 1;
        ssize_t r = send(fd, p, n < IO_CHUNK ? n : IO_CHUNK, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        if (mac) crypto_onetimeauth_update(mac, p, (size_t)r);
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

int rpl_send_all(int fd, const void *buf, size_t n, io_bound *b) { return rpl_send_bytes(fd, buf, n, b, 0, NULL); }

/* Receives exactly n bytes into buf. When crc (mac) is given, *crc (*mac) is continued over
 * each piece as it lands (still in cache), so verifying costs no second pass. 0, or -1 on EOF,
 * error or timeout. */
int rpl_recv_bytes(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc, crypto_onetimeauth_state *mac) {
    unsigned char *p = buf;
    while (n > 0) {
        int ev = rpl_wait_fd(fd, POLLIN, b);
        if (ev <= 0) return -1;
        ssize_t r = recv(fd, p, n < IO_CHUNK ? n : IO_CHUNK, MSG_DONTWAIT);
        if (r == 0) return -1; /* peer closed */
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        if (crc) *crc = crc32c(*crc, p, (size_t)r);
        if (mac) crypto_onetimeauth_update(mac, p, (size_t)r);
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

int rpl_recv_all(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc) { return rpl_recv_bytes(fd, buf, n, b, crc, NULL); }

/* Replication is request/response with small control messages: no Nagle delays. Keepalive
 * lets the kernel notice a peer host that disappeared while a connection sat idle. */
void rpl_tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

/* ------------------------------------------------------------------------------------- */
/* the job key, the handshake and tagged messages (libsodium)                             */
/* ------------------------------------------------------------------------------------- */

int replica_secret_new(char *hex, size_t len) {
    unsigned char bin[crypto_kdf_KEYBYTES];
    if (!hex || len < 2 * sizeof bin + 1 || sodium_init() < 0) return -1;
    crypto_kdf_keygen(bin); /* randombytes_buf: the kernel's getrandom */
    sodium_bin2hex(hex, len, bin, sizeof bin);
    sodium_memzero(bin, sizeof bin);
    return 0;
}

int replica_key_derive(const char *secret_hex, unsigned char key[REPLICA_KEY_BYTES]) {
    return job_key_derive(secret_hex, "DPrepl01", key, REPLICA_KEY_BYTES);
}

/* label || nh || nc || id into in (LABEL_INPUT_MAX): what the handshake's proofs MAC. Only id
 * varies in length, and it comes last. */
static size_t label_input(unsigned char *in, const char *label, const unsigned char nh[NONCE_BYTES],
                          const unsigned char nc[NONCE_BYTES], const char *id) {
    size_t n = strlen(label), k = strnlen(id, HOLDER_ID_MAX - 1);
    memcpy(in, label, n);
    memcpy(in + n, nh, NONCE_BYTES);
    memcpy(in + n + NONCE_BYTES, nc, NONCE_BYTES);
    memcpy(in + n + 2 * NONCE_BYTES, id, k);
    return n + 2 * NONCE_BYTES + k;
}

/* MAC(key, label || nh || nc || id), the handshake's proofs and session key (see the file
 * comment). */
void rpl_mac_label(unsigned char out[TAG_BYTES], const unsigned char *key, const char *label,
                      const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id) {
    unsigned char in[LABEL_INPUT_MAX];
    crypto_auth(out, in, label_input(in, label, nh, nc, id), key);
}

int rpl_verify_label(const unsigned char tag[TAG_BYTES], const unsigned char *key, const char *label,
                        const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id) {
    unsigned char in[LABEL_INPUT_MAX];
    return crypto_auth_verify(tag, in, label_input(in, label, nh, nc, id), key);
}

/* A holder's identity as the job records it (holders list, resume holder): "PROC@HOST:PORT". */
void rpl_holder_id(char id[HOLDER_ID_MAX], long proc, const char *host, int port) {
    snprintf(id, HOLDER_ID_MAX, "%ld@%s:%d", proc, host ? host : "", port);
}

/* A session under key ks (Ks, see the file comment), from the holder's side or the client's. */
void rpl_session_keyed(Session *ss, const unsigned char ks[crypto_auth_KEYBYTES], int holder) {
    memcpy(ss->ks, ks, sizeof ss->ks);
    ss->tx_seq = ss->rx_seq = 0;
    ss->tx_dir = holder ? 'H' : 'C';
    ss->rx_dir = holder ? 'C' : 'H';
}

static void session_init(Session *ss, const unsigned char *key, const unsigned char nh[NONCE_BYTES],
                         const unsigned char nc[NONCE_BYTES], const char *id, int holder) {
    unsigned char ks[crypto_auth_KEYBYTES];
    rpl_mac_label(ks, key, "DPrepl02 session", nh, nc, id);
    rpl_session_keyed(ss, ks, holder);
    sodium_memzero(ks, sizeof ks);
}

/* dir || seq || msg: what a message's tag covers. Its length. */
static size_t tag_input(unsigned char *in, char dir, uint64_t seq, const void *msg, size_t len) {
    in[0] = (unsigned char)dir;
    memcpy(in + 1, &seq, sizeof seq);
    memcpy(in + 1 + sizeof seq, msg, len);
    return 1 + sizeof seq + len;
}

/* Sends msg[0..len) and its tag. 0, or -1. */
int rpl_send_msg(int fd, Session *ss, const void *msg, size_t len, io_bound *b) {
    unsigned char in[1 + 8 + MSG_MAX], out[MSG_MAX + TAG_BYTES];
    if (len > MSG_MAX) return -1;
    size_t n = tag_input(in, ss->tx_dir, ss->tx_seq++, msg, len);
    memcpy(out, msg, len);
    crypto_auth(out + len, in, n, ss->ks);
    return rpl_send_all(fd, out, len + TAG_BYTES, b);
}

/* Checks the tag that follows msg[0..len) (already received): reads it and verifies. 0, or -1
 * (I/O, or a tag that does not match: the stream cannot be trusted any more). */
int rpl_recv_tag(int fd, Session *ss, const void *msg, size_t len, io_bound *b) {
    unsigned char in[1 + 8 + MSG_MAX], tag[TAG_BYTES];
    if (len > MSG_MAX || rpl_recv_all(fd, tag, sizeof tag, b, NULL) != 0) return -1;
    size_t n = tag_input(in, ss->rx_dir, ss->rx_seq++, msg, len);
    return crypto_auth_verify(tag, in, n, ss->ks) == 0 ? 0 : -1;
}

/* The one-time key of the payload that follows message number seq sent in direction dir
 * (see the file comment): every payload of a session gets its own. */
static void payload_key(unsigned char otk[crypto_onetimeauth_KEYBYTES], const Session *ss, char dir, uint64_t seq) {
    crypto_kdf_derive_from_key(otk, crypto_onetimeauth_KEYBYTES, seq, dir == 'C' ? "DPpayC02" : "DPpayH02", ss->ks);
}

/* Starts the MAC of the payload that follows message number seq in direction dir. */
void rpl_payload_mac_init(crypto_onetimeauth_state *mac, const Session *ss, char dir, uint64_t seq) {
    unsigned char otk[crypto_onetimeauth_KEYBYTES];
    payload_key(otk, ss, dir, seq);
    crypto_onetimeauth_init(mac, otk);
    sodium_memzero(otk, sizeof otk);
}

/* Reads the payload tag that follows a received payload and checks it against mac (which
 * covered the bytes as they landed). 0, or -1 (I/O, or a payload altered on the way). */
int rpl_recv_payload_tag(int fd, crypto_onetimeauth_state *mac, io_bound *b) {
    unsigned char got[PAYLOAD_TAG_BYTES], want[PAYLOAD_TAG_BYTES];
    crypto_onetimeauth_final(mac, want);
    int rc = rpl_recv_all(fd, got, sizeof got, b, NULL) == 0 && crypto_verify_16(got, want) == 0 ? 0 : -1;
    sodium_memzero(mac, sizeof *mac);
    return rc;
}

/* The client's side, to holder `id`. REPLICA_OK, REPLICA_IO (+ err) or REPLICA_AUTH (+ err). */
replica_status rpl_handshake_client(int fd, const unsigned char *key, const char *id, Session *ss, io_bound *b,
                                       char *err, size_t errlen) {
    unsigned char hello[4 + NONCE_BYTES], answer[NONCE_BYTES + TAG_BYTES], proof[TAG_BYTES];
    if (rpl_recv_all(fd, hello, sizeof hello, b, NULL) != 0) {
        set_err(err, errlen, "replica: no handshake from the holder in time");
        return REPLICA_IO;
    }
    if (memcmp(hello, HELLO_MAGIC, 4) != 0) {
        set_err(err, errlen, "replica: the peer is not a DeadPool replica holder");
        return REPLICA_AUTH;
    }
    const unsigned char *nh = hello + 4, *nc = answer;
    randombytes_buf(answer, NONCE_BYTES);
    rpl_mac_label(answer + NONCE_BYTES, key, "DPrepl02 client", nh, nc, id);
    if (rpl_send_all(fd, answer, sizeof answer, b) != 0 || rpl_recv_all(fd, proof, sizeof proof, b, NULL) != 0) {
        set_err(err, errlen, "replica: the holder closed the connection during the handshake (another job's key, "
                "or the port is no longer holder %s's?)", id);
        return REPLICA_IO;
    }
    if (rpl_verify_label(proof, key, "DPrepl02 holder", nh, nc, id) != 0) {
        set_err(err, errlen, "replica: the peer failed to prove it is holder %s of this job (another holder "
                "relayed to, or no key)", id);
        return REPLICA_AUTH;
    }
    session_init(ss, key, nh, nc, id, 0);
    return REPLICA_OK;
}

/* ------------------------------------------------------------------------------------- */
/* PULL sources                                                                           */
/* ------------------------------------------------------------------------------------- */

/* This process as a PULL source: 0, or -1 when the kernel does not say (no /proc). */
int rpl_pull_identity(PullSource *me) {
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
int rpl_pull_bytes(const PullSource *src, unsigned char *dst, uint64_t len, uint32_t *crc) {
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

/* The inode of the TCP socket with local address src and remote address dst (in the
 * caller's network namespace), asking the kernel's socket diagnostics for exactly that
 * connection. 0 when there is none or the kernel does not say. */
static unsigned long diag_inode(int family, const void *src, const void *dst, size_t alen, uint16_t sport_be,
                                uint16_t dport_be) {
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.r.sdiag_family = (uint8_t)family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = 1u << TCP_ESTABLISHED;
    req.r.id.idiag_sport = sport_be;
    req.r.id.idiag_dport = dport_be;
    memcpy(req.r.id.idiag_src, src, alen);
    memcpy(req.r.id.idiag_dst, dst, alen);
    req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return 0;
    struct timeval tv = {.tv_sec = 1};
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    unsigned long inode = 0;
    long buf[2048 / sizeof(long)]; /* aligned for nlmsghdr */
    if (sendto(nl, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel) == (ssize_t)sizeof req) {
        ssize_t n = recv(nl, buf, sizeof buf, 0);
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) break;
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            /* exactly the connection asked for (the kernel also finds listeners by port) */
            if (m->idiag_state == TCP_ESTABLISHED && m->id.idiag_sport == sport_be && m->id.idiag_dport == dport_be &&
                !memcmp(m->id.idiag_src, src, alen) && !memcmp(m->id.idiag_dst, dst, alen))
                inode = m->idiag_inode;
            break;
        }
    }
    close(nl);
    return inode;
}

/* The inode of the socket at the other end of the TCP connection fd, when that end is in
 * our network namespace; 0 otherwise. */
unsigned long rpl_peer_socket_inode(int fd) {
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 ||
        me.ss_family != peer.ss_family)
        return 0;
    if (me.ss_family == AF_INET) { /* the peer's socket: local = its address, remote = ours */
        const struct sockaddr_in *a = (const struct sockaddr_in *)&me, *p = (const struct sockaddr_in *)&peer;
        return diag_inode(AF_INET, &p->sin_addr, &a->sin_addr, 4, p->sin_port, a->sin_port);
    }
    if (me.ss_family != AF_INET6) return 0;
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&me, *p = (const struct sockaddr_in6 *)&peer;
    unsigned long inode = diag_inode(AF_INET6, &p->sin6_addr, &a->sin6_addr, 16, p->sin6_port, a->sin6_port);
    if (!inode && IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && IN6_IS_ADDR_V4MAPPED(&p->sin6_addr)) /* an IPv4 client */
        inode = diag_inode(AF_INET, p->sin6_addr.s6_addr + 12, a->sin6_addr.s6_addr + 12, 4, p->sin6_port, a->sin6_port);
    return inode;
}

/* 1 if process pid has the socket `inode` among its open files. */
int rpl_process_has_socket(int64_t pid, unsigned long inode) {
    char dir[64], want[64], link[64];
    if (pid <= 0 || pid > INT_MAX || inode == 0) return 0;
    snprintf(dir, sizeof dir, "/proc/%lld/fd", (long long)pid);
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            found = strcmp(link, want) == 0;
        }
    }
    closedir(d);
    return found;
}
