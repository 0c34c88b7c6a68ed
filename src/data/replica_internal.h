/* replica_internal.h — what the replication channel's files share (not installed, not
 * included outside src/data): its limits, the wire structs, the holder's state, and the
 * bounded I/O and tagged messages both ends use. The channel's API is replica.h. */
#ifndef DEADPOOL_REPLICA_INTERNAL_H
#define DEADPOOL_REPLICA_INTERNAL_H

#include <pthread.h>
#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "replica.h"
#include "replica_handshake.h"

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

typedef struct {
    int64_t deadline; /* CLOCK_MONOTONIC ms at which the transfer fails; INT64_MAX: never */
    int stall_ms;     /* > 0: every bit of progress moves the deadline to now + stall_ms */
} io_bound;

/* The longest input of a handshake MAC: label, both nonces, the holder's identity. */
#define LABEL_INPUT_MAX (32 + 2 * NONCE_BYTES + HOLDER_ID_MAX)

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

/* The holder's side of the handshake, as bytes arrive (replica_handshake.h): pure, so that
 * tests/fuzz/fuzz_replica_handshake.c drives this very code in chunks of any size. */
_Static_assert(REPLICA_HELLO_BYTES == 4 + NONCE_BYTES, "the hello is the magic and Nh");
_Static_assert(REPLICA_ANSWER_BYTES == NONCE_BYTES + TAG_BYTES, "the answer is Nc and the client's proof");
_Static_assert(REPLICA_PROOF_BYTES == TAG_BYTES, "the holder's proof is one MAC");
_Static_assert(sizeof(((ReplicaHsAccept *)0)->ks) == sizeof(((Session *)0)->ks), "Ks is a session key");

/* A connection that has not proved the key yet, its handshake run by the accept thread. */
typedef struct {
    int fd;            /* -1: a free entry */
    int64_t deadline;  /* CLOCK_MONOTONIC ms: closed when no proof came by then */
    uint64_t order;    /* accepted as the order-th: the smallest is the oldest */
    ReplicaHandshake hs;
} Pending;

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

int64_t rpl_mono_ms(void);
io_bound rpl_bound_total(int timeout_ms);
io_bound rpl_bound_stall(int stall_ms);
io_bound rpl_bound_none(void);
int rpl_wait_fd(int fd, short events, const io_bound *b);
int rpl_send_bytes(int fd, const void *buf, size_t n, io_bound *b, int watch_input, crypto_onetimeauth_state *mac);
int rpl_send_all(int fd, const void *buf, size_t n, io_bound *b);
int rpl_recv_bytes(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc, crypto_onetimeauth_state *mac);
int rpl_recv_all(int fd, void *buf, size_t n, io_bound *b, uint32_t *crc);
void rpl_tune_socket(int fd);
void rpl_mac_label(unsigned char out[TAG_BYTES], const unsigned char *key, const char *label,
                      const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id);
int rpl_verify_label(const unsigned char tag[TAG_BYTES], const unsigned char *key, const char *label,
                        const unsigned char nh[NONCE_BYTES], const unsigned char nc[NONCE_BYTES], const char *id);
void rpl_holder_id(char id[HOLDER_ID_MAX], long proc, const char *host, int port);
void rpl_session_keyed(Session *ss, const unsigned char ks[crypto_auth_KEYBYTES], int holder);
int rpl_send_msg(int fd, Session *ss, const void *msg, size_t len, io_bound *b);
int rpl_recv_tag(int fd, Session *ss, const void *msg, size_t len, io_bound *b);
void rpl_payload_mac_init(crypto_onetimeauth_state *mac, const Session *ss, char dir, uint64_t seq);
int rpl_recv_payload_tag(int fd, crypto_onetimeauth_state *mac, io_bound *b);
replica_status rpl_handshake_client(int fd, const unsigned char *key, const char *id, Session *ss, io_bound *b,
                                       char *err, size_t errlen);
int rpl_pull_identity(PullSource *me);
int rpl_pull_bytes(const PullSource *src, unsigned char *dst, uint64_t len, uint32_t *crc);
unsigned long rpl_peer_socket_inode(int fd);
int rpl_process_has_socket(int64_t pid, unsigned long inode);
Owner *rpl_owner_find(ReplicaServer *s, int rank, int create);
int rpl_wait_put_slot(ReplicaServer *s, Owner *o);
void rpl_slot_finish_put(ReplicaServer *s, Slot *sl, const SnapHeader *h);
int rpl_slot_reserve(ReplicaServer *s, Slot *sl, size_t len);
void rpl_slot_unpin(ReplicaServer *s, Slot *sl);
replica_status rpl_find_verified(ReplicaServer *s, int rank, int64_t max_step, int copy, SnapHeader *h,
                                    void **payload, Slot **pinned, crypto_onetimeauth_state *mac);
void rpl_join_conns(Conn *list);
void *rpl_accept_main(void *arg);

#endif
