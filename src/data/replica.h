/* replica.h — the replication channel: a holder process keeps other ranks' snapshots in its
 * host memory and serves them back.
 *
 * Every DeadPool process runs a replica server (a listening TCP socket plus a thread per
 * connection), separate from the training collectives, so replication never blocks them.
 * A holder keeps two slots per (owner rank): a PUT is received into the slot that does not
 * hold the newest verified generation, and becomes visible only after its CRC32C checks out,
 * so a sender that dies mid-transfer never damages the previous generation.
 *
 * The channel is authenticated: every connection starts with a mutual challenge-response
 * under a key derived from the job's secret (libsodium) that also names the holder the client
 * meant, every request and reply carries a MAC, and so does every payload that crosses the
 * wire; a holder keeps only ranks of the job and only as many bytes as its budget allows, and
 * pulls only from the process at the other end of the connection (replica.c). */
#ifndef DEADPOOL_REPLICA_H
#define DEADPOOL_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#define SNAP_MAGIC 0x31535044u /* "DPS1" */
#define SNAP_VERSION 1

/* Header of one snapshot generation, on the wire and on disk. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    char job[40];
    int64_t epoch;       /* membership epoch that produced it */
    int32_t rank;        /* owner rank */
    int32_t world;       /* data-parallel size when it was taken */
    int64_t step;        /* generation: the 0-based step whose optimizer update it follows */
    uint64_t length;     /* payload bytes */
    uint32_t crc;        /* CRC32C of the payload */
    uint32_t header_crc; /* CRC32C of every header byte before this field */
} SnapHeader;

/* Fills header_crc. */
void snap_header_seal(SnapHeader *h);
/* NULL if the header is well formed and its header_crc matches, else what is wrong. */
const char *snap_header_check(const SnapHeader *h);

/* The channel key: every process of a job derives the same one from the job's secret. */
#define REPLICA_KEY_BYTES 32
/* The job secret as text: 32 random bytes in hex. */
#define REPLICA_SECRET_HEX_LEN 64

/* A fresh job secret (32 bytes from the kernel's CSPRNG) as 64 hex digits into hex (len >= 65).
 * 0, or -1 (buffer too small, libsodium unusable). */
int replica_secret_new(char *hex, size_t len);
/* The channel key of the job whose secret is secret_hex: crypto_kdf_derive_from_key with
 * context "DPrepl01". 0, or -1 when the secret is not 64 hex digits. */
int replica_key_derive(const char *secret_hex, unsigned char key[REPLICA_KEY_BYTES]);

typedef enum {
    REPLICA_OK = 0,
    REPLICA_IO = -1,        /* connection failed, closed or timed out */
    REPLICA_REFUSED = -2,   /* the holder refused the PUT: checksum or header mismatch */
    REPLICA_NOT_FOUND = -3, /* the holder has no such generation */
    REPLICA_CORRUPT = -4,   /* data received on GET failed its checksum */
    REPLICA_NO_PULL = -5,   /* the holder cannot read the sender's memory: send the bytes */
    REPLICA_AUTH = -6       /* the peer did not prove it holds the job's key and is the holder
                               meant, or a payload failed its MAC */
} replica_status;

typedef struct ReplicaServer ReplicaServer;

/* Listens on bind_host:port (port 0 = any free port) for job `job` of `world` ranks, serving
 * only clients that prove they hold `key` (copied) and mean this holder: process `proc` of the
 * job (0: a launcher) at bind_host and the port bound, as the job records it ("PROC@HOST:PORT",
 * see replica_connect). Snapshots of another world size or of a rank >= world are refused.
 * NULL + err on failure. */
ReplicaServer *replica_server_start(const char *bind_host, int port, const char *job, int world, long proc,
                                    const unsigned char key[REPLICA_KEY_BYTES], char *err, size_t errlen);
int replica_server_port(const ReplicaServer *s);
/* The key the server was started with, for this process's own client connections. */
const unsigned char *replica_server_key(const ReplicaServer *s);
/* The most bytes all slots together may hold (default: half the physical memory, or of the
 * cgroup's memory limit when lower). A PUT, PULL or RESERVE that would need more is refused.
 * Slots already allocated stay. */
void replica_server_set_max_bytes(ReplicaServer *s, uint64_t bytes);
/* Fencing: from now on, PUTs of snapshots taken in an epoch < epoch are refused. */
void replica_server_set_min_epoch(ReplicaServer *s, int64_t epoch);
/* CPU time the holder's threads have spent taking in replicas (PUT and PULL; not RESERVE), ms. */
double replica_server_cpu_ms(ReplicaServer *s);
/* Closes the socket, ends every connection thread, frees every slot. */
void replica_server_stop(ReplicaServer *s);
/* A copy (malloc'ed into *payload) of the newest verified generation of `rank` that is
 * <= max_step (max_step < 0: the newest). REPLICA_OK or REPLICA_NOT_FOUND; REPLICA_CORRUPT
 * when the stored bytes of every such generation failed their re-verification (a memory
 * fault: those generations are dropped). GET answers the same way. */
replica_status replica_server_lookup(ReplicaServer *s, int rank, int64_t max_step, SnapHeader *h, void **payload);
/* The step and epoch of the newest generation of `rank` this holder has verified on arrival
 * (not read again). 0, or -1 when it holds none. After a control-plane outage a process
 * publishes it, so that a coordinator can roll a rank that died meanwhile back to what its
 * holders really have (its own commit records may not have reached Redis). */
int replica_server_newest(ReplicaServer *s, int rank, int64_t *step, int64_t *epoch);
/* Fault injection (--inject corrupt:RANK@STEP): from now on every generation of `rank` this
 * holder has or gets turns bad when it is read, as a memory fault would make it (its CRC no
 * longer matches: GET answers REPLICA_CORRUPT). */
void replica_server_corrupt_rank(ReplicaServer *s, int rank);
/* For tests only: flips one bit of the stored payload of rank's valid generation `step`, as a
 * memory fault would. 0, or -1 when there is no such generation or byte. */
int replica_server_debug_flip(ReplicaServer *s, int rank, int64_t step, uint64_t offset);

/* Request type bytes on the wire (the protocol is described in replica.c). */
#define REPLICA_REQ_PUT 'P'
#define REPLICA_REQ_GET 'G'
#define REPLICA_REQ_PULL 'L'
#define REPLICA_REQ_RESERVE 'R'

/* A client connection to one holder. After an I/O failure or a refusal it is reopened by
 * the next call, so one ReplicaConn can be kept for the whole job. timeout_ms bounds the
 * whole call (connect, send, receive), plus the time the generation's bytes take at the floor
 * rate (bound_for_bytes_ms) where a payload moves; values <= 0 mean 1 ms. */
typedef struct ReplicaConn ReplicaConn;

/* Connects to holder process `proc` of the job (0: a launcher) at host:port and runs the
 * handshake, bounded by timeout_ms: both sides prove they hold `key` (copied), bound to the
 * holder's identity "PROC@HOST:PORT", so only that very holder can answer (not another member
 * of the job that a process squatting the port relays to). NULL + err. With allow_pull, a
 * holder on the same machine copies a PUT's payload straight out of this process's memory
 * (process_vm_readv: one copy instead of a send and a receive through the kernel); the holder
 * checksums the bytes it took (against the header's CRC, or computing it:
 * replica_put_summing), and a holder elsewhere, or one that is not allowed to read us, gets
 * them over TCP, MAC'd. */
ReplicaConn *replica_connect(const char *host, int port, long proc, int timeout_ms, int allow_pull,
                             const unsigned char key[REPLICA_KEY_BYTES], char *err, size_t errlen);
void replica_close(ReplicaConn *c);

/* Replicates one generation and waits for the holder's verdict (bounded by timeout_ms).
 * payload must stay unchanged until this returns. */
replica_status replica_put(ReplicaConn *c, const SnapHeader *h, const void *payload, int timeout_ms);
/* The same for a header whose crc is not computed yet: a holder that pulls computes it from
 * the bytes it copies (one pass over them, where otherwise the owner would make another) and
 * *h is set to the header it stored, crc filled in and resealed; before a PUT over TCP this
 * call computes it. So after REPLICA_OK, h->crc is the payload's CRC32C. */
replica_status replica_put_summing(ReplicaConn *c, SnapHeader *h, const void *payload, int timeout_ms);
/* Tells the holder that h->rank's generations will be h->length bytes (h->step is unused),
 * so it allocates both slots and faults their pages in now, ahead of the first PUT, rather
 * than during the first two while training runs. Slots that hold a generation are left
 * alone. REPLICA_REFUSED for a header the holder would not take, or slots beyond its budget.
 * Advisory: a failure only means the first PUTs pay for the page faults. */
replica_status replica_reserve(ReplicaConn *c, const SnapHeader *h, int timeout_ms);
/* 1 if the last successful replica_put on c was pulled by the holder, 0 if it went over TCP. */
int replica_last_put_pulled(const ReplicaConn *c);
/* Fetches rank's newest verified generation <= max_step (max_step < 0: newest) for job;
 * verifies the header, the payload's MAC (REPLICA_AUTH when it fails: altered on the way) and
 * its checksum. *payload is malloc'ed. */
replica_status replica_get(ReplicaConn *c, const char *job, int rank, int64_t max_step, SnapHeader *h,
                           void **payload, int timeout_ms);
/* The same, received where place(arg, length) says once the verified header has told the
 * payload's length (then *payload is that pointer), or into a malloc'ed buffer when place is
 * NULL or returns NULL. A spare has such memory with its pages already faulted in: on a VM
 * the first touch of fresh memory can cost more than the transfer (5 ms per MiB measured
 * here). What place gave is undefined after a failure. */
replica_status replica_get_into(ReplicaConn *c, const char *job, int rank, int64_t max_step, SnapHeader *h,
                                void *(*place)(void *arg, uint64_t length), void *arg, void **payload, int timeout_ms);

const char *replica_status_str(replica_status s);

#endif
