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
#define HANDSHAKE_MS 2000     /* a client must have proved the key within this */
#define MAX_HANDSHAKING 1024  /* connections not yet authenticated; a new one beyond closes the oldest */
#define MAX_CONNS 4096        /* authenticated connections; more wait to be accepted */
#define ACCEPT_BURST 64       /* connections accepted per wake-up of the accept thread */
#define IO_CHUNK (4u << 20)   /* bytes per send/recv call */
#define PULL_CHUNK (256u << 10) /* bytes per process_vm_readv: checksummed while still in L2 */
#define VERIFY_CHUNK PULL_CHUNK /* a GET's stored bytes are checksummed and MAC'd in one pass of these */

/* Where a PULL's payload lies: a process is named by its pid only within one kernel (boot)
 * and one pid namespace, so the holder pulls only when both match its own. */
typedef struct {
    char boot_id[40];  /* /proc/sys/kernel/random/boot_id, NUL-padded */
    uint64_t pidns;    /* inode of /proc/self/ns/pid */
    int64_t pid;
    uint64_t addr;
    uint32_t crc_known; /* 0: the header's crc is not computed yet: the holder computes it */
    uint32_t unused;    /* zero */
} PullSource;
_Static_assert(sizeof(PullSource) == 72, "PullSource travels as 72 raw bytes");

#define NONCE_BYTES 32
#define TAG_BYTES crypto_auth_BYTES
#define PAYLOAD_TAG_BYTES crypto_onetimeauth_BYTES
#define HELLO_MAGIC "DPR2"
#define HOLDER_ID_MAX 300 /* "PROC@HOST:PORT": 20 + 1 + 255 + 1 + 5 digits and a NUL fit */
#define MSG_MAX (1 + sizeof(SnapHeader) + sizeof(PullSource)) /* the longest tagged message (PULL) */
_Static_assert(sizeof(int32_t) + sizeof(SnapHeader) <= MSG_MAX, "GET's reply fits a message buffer");
_Static_assert(REPLICA_KEY_BYTES == crypto_auth_KEYBYTES, "the channel key is a crypto_auth key");
_Static_assert(REPLICA_KEY_BYTES == crypto_kdf_KEYBYTES, "the job secret is a crypto_kdf key");
_Static_assert(crypto_auth_BYTES == crypto_kdf_KEYBYTES, "a session key (a crypto_auth tag) is a crypto_kdf key");

/* One end of an authenticated connection: the session key and the message counters. */
typedef struct {
    unsigned char ks[crypto_auth_KEYBYTES];
    uint64_t tx_seq, rx_seq;
    char tx_dir, rx_dir; /* 'C' client, 'H' holder */
} Session;

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
 * holder's early verdict). When mac is given, it is continued over each piece as it goes out
 * (still in cache). 0 all sent, 1 input is waiting, -1 failure or timeout. */
static int send_bytes(int fd, const void *buf, size_t n, io_bound *b, int watch_input, crypto_onetimeauth_state *mac) {
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
        if (mac) crypto_onetimeauth_update(mac, p, (size_t)r);
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

static int send_all(int fd, const void *buf, size_t n, io_bound *b) { return send_bytes(fd, buf, n, b, 0, NULL); }

/* Receives exactly n bytes into buf. When crc (mac) is given, *crc (*mac) is continued over
 * each piece as it lands (still in cache), so verifying costs no second pass. 0, or -1 on EOF,
 * error or timeout. */
static int recv_bytes(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc, crypto_onetimeauth_state *mac) {
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
        if (mac) crypto_onetimeauth_update(mac, p, (size_t)r);
        p += r;
        n -= (size_t)r;
        bound_progress(b);
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc) { return recv_bytes(fd, buf, n, b, crc, NULL); }

/* Replication is request/response with small control messages: no Nagle delays. Keepalive
 * lets the kernel notice a peer host that disappeared while a connection sat idle. */
static void tune_socket(int fd) {
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

/* The longest input of a handshake MAC: label, both nonces, the holder's identity. */
#define LABEL_INPUT_MAX (32 + 2 * NONCE_BYTES + HOLDER_ID_MAX)

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
static void mac_label(unsigned char out[TAG_BYTES], const unsigned char *key, const char *label,
                      const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id) {
    unsigned char in[LABEL_INPUT_MAX];
    crypto_auth(out, in, label_input(in, label, nh, nc, id), key);
}

static int verify_label(const unsigned char tag[TAG_BYTES], const unsigned char *key, const char *label,
                        const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id) {
    unsigned char in[LABEL_INPUT_MAX];
    return crypto_auth_verify(tag, in, label_input(in, label, nh, nc, id), key);
}

/* A holder's identity as the job records it (holders list, resume holder): "PROC@HOST:PORT". */
static void holder_id(char id[HOLDER_ID_MAX], long proc, const char *host, int port) {
    snprintf(id, HOLDER_ID_MAX, "%ld@%s:%d", proc, host ? host : "", port);
}

/* A session under key ks (Ks, see the file comment), from the holder's side or the client's. */
static void session_keyed(Session *ss, const unsigned char ks[crypto_auth_KEYBYTES], int holder) {
    memcpy(ss->ks, ks, sizeof ss->ks);
    ss->tx_seq = ss->rx_seq = 0;
    ss->tx_dir = holder ? 'H' : 'C';
    ss->rx_dir = holder ? 'C' : 'H';
}

static void session_init(Session *ss, const unsigned char *key, const unsigned char nh[NONCE_BYTES],
                         const unsigned char nc[NONCE_BYTES], const char *id, int holder) {
    unsigned char ks[crypto_auth_KEYBYTES];
    mac_label(ks, key, "DPrepl02 session", nh, nc, id);
    session_keyed(ss, ks, holder);
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
static int send_msg(int fd, Session *ss, const void *msg, size_t len, io_bound *b) {
    unsigned char in[1 + 8 + MSG_MAX], out[MSG_MAX + TAG_BYTES];
    if (len > MSG_MAX) return -1;
    size_t n = tag_input(in, ss->tx_dir, ss->tx_seq++, msg, len);
    memcpy(out, msg, len);
    crypto_auth(out + len, in, n, ss->ks);
    return send_all(fd, out, len + TAG_BYTES, b);
}

/* Checks the tag that follows msg[0..len) (already received): reads it and verifies. 0, or -1
 * (I/O, or a tag that does not match: the stream cannot be trusted any more). */
static int recv_tag(int fd, Session *ss, const void *msg, size_t len, io_bound *b) {
    unsigned char in[1 + 8 + MSG_MAX], tag[TAG_BYTES];
    if (len > MSG_MAX || recv_all(fd, tag, sizeof tag, b, NULL) != 0) return -1;
    size_t n = tag_input(in, ss->rx_dir, ss->rx_seq++, msg, len);
    return crypto_auth_verify(tag, in, n, ss->ks) == 0 ? 0 : -1;
}

/* The one-time key of the payload that follows message number seq sent in direction dir
 * (see the file comment): every payload of a session gets its own. */
static void payload_key(unsigned char otk[crypto_onetimeauth_KEYBYTES], const Session *ss, char dir, uint64_t seq) {
    crypto_kdf_derive_from_key(otk, crypto_onetimeauth_KEYBYTES, seq, dir == 'C' ? "DPpayC02" : "DPpayH02", ss->ks);
}

/* Starts the MAC of the payload that follows message number seq in direction dir. */
static void payload_mac_init(crypto_onetimeauth_state *mac, const Session *ss, char dir, uint64_t seq) {
    unsigned char otk[crypto_onetimeauth_KEYBYTES];
    payload_key(otk, ss, dir, seq);
    crypto_onetimeauth_init(mac, otk);
    sodium_memzero(otk, sizeof otk);
}

/* Reads the payload tag that follows a received payload and checks it against mac (which
 * covered the bytes as they landed). 0, or -1 (I/O, or a payload altered on the way). */
static int recv_payload_tag(int fd, crypto_onetimeauth_state *mac, io_bound *b) {
    unsigned char got[PAYLOAD_TAG_BYTES], want[PAYLOAD_TAG_BYTES];
    crypto_onetimeauth_final(mac, want);
    int rc = recv_all(fd, got, sizeof got, b, NULL) == 0 && crypto_verify_16(got, want) == 0 ? 0 : -1;
    sodium_memzero(mac, sizeof *mac);
    return rc;
}

/* The client's side, to holder `id`. REPLICA_OK, REPLICA_IO (+ err) or REPLICA_AUTH (+ err). */
static replica_status handshake_client(int fd, const unsigned char *key, const char *id, Session *ss, io_bound *b,
                                       char *err, size_t errlen) {
    unsigned char hello[4 + NONCE_BYTES], answer[NONCE_BYTES + TAG_BYTES], proof[TAG_BYTES];
    if (recv_all(fd, hello, sizeof hello, b, NULL) != 0) {
        set_err(err, errlen, "replica: no handshake from the holder in time");
        return REPLICA_IO;
    }
    if (memcmp(hello, HELLO_MAGIC, 4) != 0) {
        set_err(err, errlen, "replica: the peer is not a DeadPool replica holder");
        return REPLICA_AUTH;
    }
    const unsigned char *nh = hello + 4, *nc = answer;
    randombytes_buf(answer, NONCE_BYTES);
    mac_label(answer + NONCE_BYTES, key, "DPrepl02 client", nh, nc, id);
    if (send_all(fd, answer, sizeof answer, b) != 0 || recv_all(fd, proof, sizeof proof, b, NULL) != 0) {
        set_err(err, errlen, "replica: the holder closed the connection during the handshake (another job's key, "
                "or the port is no longer holder %s's?)", id);
        return REPLICA_IO;
    }
    if (verify_label(proof, key, "DPrepl02 holder", nh, nc, id) != 0) {
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
static unsigned long peer_socket_inode(int fd) {
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
static int process_has_socket(int64_t pid, unsigned long inode) {
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
    /* the connection thread's own */
    Session ss;
    int64_t peer_pid;   /* a pid proved to be the process at the other end (PULL), 0 none */
    int peer_warned;    /* a PULL naming another process was logged */
} Conn;

struct ReplicaServer {
    int listen_fd;
    int wake[2]; /* pipe: a byte in wake[0] tells the accept thread to stop */
    int port;
    char job[JOB_LEN];
    int world;                               /* the job's ranks: headers must say exactly this */
    unsigned char key[REPLICA_KEY_BYTES];    /* the channel key (never changes after start) */
    char id[HOLDER_ID_MAX];                  /* who we are, "PROC@HOST:PORT" (never changes after start) */
    pthread_t accept_thread;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t slot_cv; /* a slot stopped being busy/pinned, or the server is stopping */
    int stopping;
    Conn *conns;
    int n_conns; /* connections that proved the key (each with its thread) */
    uint64_t max_bytes;  /* budget: the most bytes all slots together may hold */
    uint64_t held_bytes; /* bytes allocated in slots (their caps) */
    Owner **owners;
    int n_owners, cap_owners;
    uint64_t next_seq;
    int64_t min_epoch; /* PUTs from older epochs are refused (fenced writers) */
    double put_cpu_ms; /* CPU time spent in PUTs and PULLs */
    PullSource self;   /* this process as a PULL source would name it */
    int self_known;    /* self is valid: PULLs are possible at all */
    int corrupt_rank;  /* fault injection: this rank's stored bytes turn bad when read (-1 none) */
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

/* Makes a busy slot's buffer hold at least len bytes, within the holder's budget. Called
 * without the lock: a busy slot belongs to its PUT alone (its cap and data too). The old bytes
 * are dead, so free + malloc rather than realloc, which would copy them. 0, or -1 over budget
 * (the slot is left as it was) or without memory (the slot is then left empty). */
static int slot_reserve(ReplicaServer *s, Slot *sl, size_t len) {
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

static void slot_unpin(ReplicaServer *s, Slot *sl) {
    pthread_mutex_lock(&s->mu);
    if (--sl->readers == 0) pthread_cond_broadcast(&s->slot_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Finds the newest generation of rank <= max_step whose stored bytes still match their CRC
 * (see the file comment), pinned so no PUT reuses it, and re-verified without the lock.
 * With `copy`, the bytes are copied out in the same pass (crc32c_copy) into a malloc'ed
 * *payload and the slot is unpinned again; without, *pinned is the slot, still pinned: the
 * caller reads sl->data and then calls slot_unpin, and when `mac` is given (a GET) it covers
 * the bytes of the generation found, computed in the same pass. OK, NOT_FOUND, CORRUPT (every
 * candidate failed), or IO (out of memory for the copy). */
static replica_status find_verified(ReplicaServer *s, int rank, int64_t max_step, int copy, SnapHeader *h,
                                    void **payload, Slot **pinned, crypto_onetimeauth_state *mac) {
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
        if (rank == s->corrupt_rank && hh.length > 0) sl->data[hh.length / 2] ^= 0x10; /* --inject corrupt */
        pthread_mutex_unlock(&s->mu);

        unsigned char *out = NULL;
        uint32_t crc = 0;
        crypto_onetimeauth_state try_mac;
        if (copy) {
            out = malloc(hh.length ? hh.length : 1);
            if (!out) {
                slot_unpin(s, sl);
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
                slot_unpin(s, sl);
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
    replica_status st = find_verified(s, rank, max_step, 1, h, payload, NULL, NULL);
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

/* Sends a status (and, for GET, the header after it) as one tagged reply. 0, or -1. */
static int send_reply(Conn *c, replica_status st, const SnapHeader *h, io_bound *b) {
    unsigned char msg[sizeof(int32_t) + sizeof(SnapHeader)];
    int32_t v = (int32_t)st;
    memcpy(msg, &v, sizeof v);
    if (h) memcpy(msg + sizeof v, h, sizeof *h);
    return send_msg(c->fd, &c->ss, msg, sizeof v + (h ? sizeof *h : 0), b);
}

/* Reads the rest of a request whose type byte is req[0]: req[1..len), then its tag. 0, or -1
 * (I/O, or a tag that fails: the connection is closed without acting on it). */
static int recv_request(Conn *c, unsigned char *req, size_t len, io_bound *b) {
    if (recv_all(c->fd, req + 1, len - 1, b, NULL) != 0) return -1;
    if (recv_tag(c->fd, &c->ss, req, len, b) == 0) return 0;
    log_msg("replica: a request with a bad MAC; connection closed");
    return -1;
}

/* Refuses a PUT before its payload: the verdict, a half-close, then input is discarded for
 * a moment so the sender reads the verdict instead of a connection reset. */
static void refuse_early(Conn *c) {
    io_bound b = bound_stall(REFUSE_DRAIN_MS);
    if (send_reply(c, REPLICA_REFUSED, NULL, &b) != 0) return;
    shutdown(c->fd, SHUT_WR);
    b = bound_total(REFUSE_DRAIN_MS);
    char sink[65536];
    while (wait_fd(c->fd, POLLIN, &b) > 0) {
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
    if (slot_reserve(s, sl, h->length) != 0) {
        slot_finish_put(s, sl, NULL);
        return NULL;
    }
    return sl;
}

/* Whether pid is the process at the other end of this connection (see the file comment).
 * Remembered for the connection once proved. */
static int pull_source_is_peer(Conn *c, int64_t pid) {
    if (c->peer_pid > 0 && c->peer_pid == pid) return 1;
    unsigned long inode = peer_socket_inode(c->fd);
    if (inode && process_has_socket(pid, inode)) {
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
    io_bound b = bound_stall(SERVER_STALL_MS);
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
    int good = pull_bytes(&src, sl->data, h.length, &crc) == 0 && (!src.crc_known || crc == h.crc);
    if (good && !src.crc_known) { /* the owner's bytes cannot change before our verdict: this is their CRC */
        h.crc = crc;
        snap_header_seal(&h);
    }
    slot_finish_put(s, sl, good ? &h : NULL);
    return send_reply(c, good ? REPLICA_OK : REPLICA_NO_PULL, good ? &h : NULL, &b) == 0;
}

/* One RESERVE (the type byte already read). 1 to keep serving the connection, 0 to close it.
 * A slot is only taken while it is free in every sense (no generation, no PUT, no reader),
 * and marked busy meanwhile, so a PUT arriving during the page faults waits for it. */
static int serve_reserve(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + sizeof(SnapHeader)] = {REPLICA_REQ_RESERVE};
    SnapHeader h;
    io_bound b = bound_stall(SERVER_STALL_MS);
    if (recv_request(c, req, sizeof req, &b) != 0) return 0;
    memcpy(&h, req + 1, sizeof h);
    if (put_header_problem(s, &h)) return send_reply(c, REPLICA_REFUSED, NULL, &b) == 0;
    int refused = 0;
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&s->mu);
        Owner *o = owner_find(s, h.rank, 1);
        Slot *sl = o ? &o->slot[i] : NULL;
        int take = sl && !sl->valid && !sl->busy && sl->readers == 0 && sl->cap < h.length;
        if (take) sl->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (!take) continue;
        if (slot_reserve(s, sl, h.length) == 0) prefault(sl->data, h.length);
        else refused = 1;
        slot_finish_put(s, sl, NULL);
    }
    b = bound_stall(SERVER_STALL_MS);
    return send_reply(c, refused ? REPLICA_REFUSED : REPLICA_OK, NULL, &b) == 0;
}

/* One PUT (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_put(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + sizeof(SnapHeader)] = {REPLICA_REQ_PUT};
    SnapHeader h;
    io_bound b = bound_stall(SERVER_STALL_MS);
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
    payload_mac_init(&mac, &c->ss, c->ss.rx_dir, c->ss.rx_seq - 1); /* the payload of the request just read */
    b = bound_stall(SERVER_STALL_MS);
    if (recv_bytes(c->fd, sl->data, h.length, &b, &crc, &mac) != 0) {
        slot_finish_put(s, sl, NULL); /* sender gone mid-payload: the other slot is untouched */
        return 0;
    }
    if (recv_payload_tag(c->fd, &mac, &b) != 0) {
        /* altered on the way (the CRC may well match: anybody can fix it up): never stored */
        slot_finish_put(s, sl, NULL);
        log_msg("replica: the payload of a PUT of rank %d step %lld failed its MAC; refused, connection closed",
                h.rank, (long long)h.step);
        send_reply(c, REPLICA_REFUSED, NULL, &b);
        return 0;
    }
    int good = crc == h.crc;
    slot_finish_put(s, sl, good ? &h : NULL);
    return send_reply(c, good ? REPLICA_OK : REPLICA_REFUSED, NULL, &b) == 0;
}

/* One GET (the type byte already read). 1 to keep serving the connection, 0 to close it. */
static int serve_get(ReplicaServer *s, Conn *c) {
    unsigned char req[1 + GET_REQ_LEN] = {REPLICA_REQ_GET};
    io_bound b = bound_stall(SERVER_STALL_MS);
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
    payload_mac_init(&mac, &c->ss, c->ss.tx_dir, c->ss.tx_seq); /* the payload of the reply sent next */
    int job_ok = memchr(job, '\0', sizeof job) && strncmp(job, s->job, sizeof job) == 0;
    if (job_ok && rank >= 0 && rank < s->world) st = find_verified(s, rank, max_step, 0, &h, NULL, &sl, &mac);
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
    int rc = send_reply(c, REPLICA_OK, &h, &b) == 0 && send_all(c->fd, sl->data, h.length, &b) == 0 &&
             send_all(c->fd, tag, sizeof tag, &b) == 0;
    slot_unpin(s, sl);
    return rc;
}

static void *conn_main(void *arg) {
    Conn *c = arg;
    pthread_setname_np(pthread_self(), "dp-holder");
    ReplicaServer *s = c->srv;
    /* The accept thread started us once the peer proved it holds the job's key (c->ss). */
    for (;;) {
        unsigned char type;
        io_bound idle = bound_none(); /* an idle connection may wait for its next request */
        if (recv_all(c->fd, &type, 1, &idle, NULL) != 0) break;
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
            s->n_conns--;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    join_conns(done);
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

/* The holder's side of the handshake, as bytes arrive (replica_handshake.h): pure, so that
 * tests/fuzz/fuzz_replica_handshake.c drives this very code in chunks of any size. */
_Static_assert(REPLICA_HELLO_BYTES == 4 + NONCE_BYTES, "the hello is the magic and Nh");
_Static_assert(REPLICA_ANSWER_BYTES == NONCE_BYTES + TAG_BYTES, "the answer is Nc and the client's proof");
_Static_assert(REPLICA_PROOF_BYTES == TAG_BYTES, "the holder's proof is one MAC");
_Static_assert(sizeof(((ReplicaHsAccept *)0)->ks) == sizeof(((Session *)0)->ks), "Ks is a session key");

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
    if (verify_label(h->answer + NONCE_BYTES, key, "DPrepl02 client", nh, nc, id) != 0) {
        h->verdict = REPLICA_HS_REFUSE;
        h->why = "the client's proof does not hold for this holder's key and identity (another job's key, or a "
                 "client that meant another holder)";
        return h->verdict;
    }
    mac_label(out->proof, key, "DPrepl02 holder", nh, nc, id);
    mac_label(out->ks, key, "DPrepl02 session", nh, nc, id);
    h->verdict = REPLICA_HS_ACCEPT;
    return h->verdict;
}

/* A connection that has not proved the key yet, its handshake run by the accept thread. */
typedef struct {
    int fd;            /* -1: a free entry */
    int64_t deadline;  /* CLOCK_MONOTONIC ms: closed when no proof came by then */
    uint64_t order;    /* accepted as the order-th: the smallest is the oldest */
    ReplicaHandshake hs;
} Pending;

/* Accepts a connection into pending (closing the oldest waiting one when every entry is taken)
 * and sends the hello. 1 accepted, 0 nothing to accept, -1 out of descriptors or memory. */
static int accept_pending(ReplicaServer *s, Pending *pending, int cap, uint64_t *order) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ? 0 : -1;
    tune_socket(fd);
    Pending *slot = NULL;
    for (int i = 0; i < cap; i++) {
        if (pending[i].fd < 0) { slot = &pending[i]; break; }
        if (!slot || pending[i].order < slot->order) slot = &pending[i];
    }
    if (slot->fd >= 0) close(slot->fd); /* the oldest stranger makes room */
    slot->fd = fd;
    slot->deadline = mono_ms() + HANDSHAKE_MS;
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
    session_keyed(&ss, acc.ks, 1);
    sodium_memzero(&acc, sizeof acc);
    start_conn(s, fd, &ss);
    sodium_memzero(&ss, sizeof ss);
}

static void *accept_main(void *arg) {
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
        int64_t now = mono_ms(), next = now + (full ? 5 : 1000); /* the timeout also paces reaping */
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
    s->self_known = pull_identity(&s->self) == 0;
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
    holder_id(s->id, proc, bind_host, s->port);
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
    join_conns(conns);

    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free_owners(s);
    pthread_cond_destroy(&s->slot_cv);
    pthread_mutex_destroy(&s->mu);
    sodium_memzero(s->key, sizeof s->key);
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
    unsigned char key[REPLICA_KEY_BYTES];
    char id[HOLDER_ID_MAX]; /* the holder meant, "PROC@HOST:PORT" */
    Session ss;      /* of the connection fd */
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

/* Connects c to its holder and authenticates, within the bound: REPLICA_OK (c->fd set),
 * REPLICA_IO or REPLICA_AUTH (+ err; c->fd stays -1). */
static replica_status conn_open(ReplicaConn *c, io_bound *b, char *err, size_t errlen) {
    int fd = connect_bounded(c->host, c->port, b, err, errlen);
    if (fd < 0) return REPLICA_IO;
    replica_status st = handshake_client(fd, c->key, c->id, &c->ss, b, err, errlen);
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
    holder_id(c->id, proc, host, port);
    c->fd = -1;
    memcpy(c->key, key, REPLICA_KEY_BYTES);
    c->pull = allow_pull && pull_identity(&c->me) == 0;
    /* Where the kernel restricts reading a process to its ancestors (Yama ptrace_scope 1),
     * let our holders, which are siblings, read us. */
    if (c->pull) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    io_bound b = bound_total(timeout_ms);
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
    if (recv_all(c->fd, msg, sizeof *st, b, NULL) != 0) return -1;
    memcpy(st, msg, sizeof *st);
    if (*st == REPLICA_OK && h) {
        if (recv_all(c->fd, msg + len, sizeof *h, b, NULL) != 0) return -1;
        len += sizeof *h;
    }
    if (recv_tag(c->fd, &c->ss, msg, len, b) != 0) {
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
    if (send_msg(c->fd, &c->ss, req, len, b) != 0 || recv_reply(c, &st, NULL, b) != 0) {
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
    if (send_msg(c->fd, &c->ss, req, sizeof req, b) != 0 || recv_reply(c, &st, &stored, b) != 0) {
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
    io_bound b = bound_total(timeout_ms);
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
    io_bound b = bound_total(bound_for_bytes_ms(timeout_ms, h->length)); /* a bigger state takes longer */
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
    int sent = send_msg(c->fd, &c->ss, head, sizeof head, &b) == 0 ? 0 : -1;
    if (sent == 0) {
        crypto_onetimeauth_state mac;
        unsigned char tag[PAYLOAD_TAG_BYTES];
        payload_mac_init(&mac, &c->ss, c->ss.tx_dir, c->ss.tx_seq - 1); /* the payload of the request just sent */
        sent = send_bytes(c->fd, payload, h->length, &b, 1, &mac);
        crypto_onetimeauth_final(&mac, tag);
        if (sent == 0 && send_all(c->fd, tag, sizeof tag, &b) != 0) sent = -1;
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
    io_bound b = bound_total(timeout_ms);
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
    if (send_msg(c->fd, &c->ss, req, sizeof req, &b) != 0 || recv_reply(c, &st, &got, &b) != 0) {
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
    b = bound_total(bound_for_bytes_ms(timeout_ms, got.length)); /* the payload: as long as its bytes take */
    unsigned char *into = place ? place(arg, got.length) : NULL;
    int own = into == NULL;
    unsigned char *buf = own ? malloc(got.length ? got.length : 1) : into;
    if (!buf) {
        conn_drop(c);
        return REPLICA_IO;
    }
    uint32_t crc = 0;
    crypto_onetimeauth_state mac;
    payload_mac_init(&mac, &c->ss, c->ss.rx_dir, reply_seq);
    if (recv_bytes(c->fd, buf, got.length, &b, &crc, &mac) != 0) {
        if (own) free(buf);
        sodium_memzero(&mac, sizeof mac);
        conn_drop(c);
        return REPLICA_IO;
    }
    if (recv_payload_tag(c->fd, &mac, &b) != 0) {
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
    Owner *o = owner_find(s, rank, 0);
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
