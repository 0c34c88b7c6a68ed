/* comm.h — collective communication between the ranks of one membership epoch.
 *
 * A narrow C API over Gloo's algorithms on an authenticating transport of DeadPool's own (the
 * only C++ in DeadPool lives in comm_gloo*.cc). A communicator
 * is built once per (job, epoch) and cannot be repaired: after any error, destroy it and
 * build a new one with a new store prefix. Every call has a timeout and reports failure as a
 * status code; no exception or abort ever leaves the shim. Reductions run in a fixed order
 * (ring), so the result does not depend on timing. */
#ifndef DEADPOOL_COMM_H
#define DEADPOOL_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    COMM_OK = 0,
    COMM_ERR_PEER = 1,     /* a peer closed or reset the connection (it likely died) */
    COMM_ERR_TIMEOUT = 2,  /* the operation did not complete within its timeout */
    COMM_ERR_INVALID = 3,  /* bad arguments */
    COMM_ERR_STORE = 4,    /* rendezvous store (Redis) unreachable or refused */
    COMM_ERR_INTERNAL = 5  /* anything else Gloo reported */
} comm_status;

typedef struct comm comm_t;

/* Where the rendezvous happens: a Redis server that every rank reaches; and the job's
 * data-plane key (COMM_KEY_BYTES = 32 bytes, comm_key_derive in comm_auth.h), which every
 * connection between two ranks proves, for this communicator and both ranks, before it carries
 * a byte; every frame on it is authenticated with a key of that connection (comm_auth.h).
 * Required when size > 1. */
typedef struct {
    const char *host;
    int port;
    const char *password; /* may be NULL */
    const char *abort_key; /* joining gives up once this Redis key exists (NULL: never) */
    const unsigned char *key; /* the job's data-plane key */
} comm_store_addr;

/* Joins the communicator of `size` ranks under `prefix` (unique per job and epoch) as `rank`.
 * bind_host is the local address to listen on ("127.0.0.1" on one host). Blocks until all
 * ranks have joined or timeout_ms passes. On failure returns NULL and writes a message into err. */
comm_t *comm_create(const comm_store_addr *store, const char *prefix, int rank, int size,
                    const char *bind_host, int timeout_ms, char *err, size_t errlen);
void comm_destroy(comm_t *c);

int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
/* The Redis list that `rank` waits on in the rendezvous under `prefix` (protocol.h:
 * proto_rdzv_key's PROTO_RDZV_WAKE; "" when it does not fit in len). Whoever sets the abort
 * key ends a wait at once by pushing COMM_WAKE_ABORT onto it (the key alone is seen within
 * Redis' timer resolution, 100 ms by default). A communicator created with an abort key keeps
 * waiting on that list afterwards (a thread and a Redis connection of its own): the push then
 * aborts it (comm_abort), so the ranks leave a collective in flight at once. */
#define COMM_WAKE_ABORT "abort"
void comm_wake_key(const char *prefix, int rank, char *out, size_t len);
/* Fails the collective in flight (from any thread) and every later one with COMM_ERR_PEER,
 * here and, within a network round trip, on every peer blocked on this rank: the sockets of
 * the communicator's pairs are shut down. Gloo's algorithms cannot be aborted from outside. */
void comm_abort(comm_t *c);
/* How many pair sockets comm_abort reaches (size - 1 when all were found). */
size_t comm_abort_sockets(const comm_t *c);
/* Redis round trips the rendezvous of comm_create took (0 for size 1). */
unsigned long comm_store_round_trips(const comm_t *c);
/* Where comm_create's time went: publishing this rank's addresses until it had every peer's
 * (mostly waiting for the last rank to arrive), and connecting the pairs. */
void comm_rendezvous_ms(const comm_t *c, double *wait_ms, double *connect_ms);
/* The pair connections comm_create made: dialed to a peer (and proven), accepted from one
 * (0 and 0 for size 1). A full mesh: rank r dials r and accepts size-1-r. */
void comm_connections(const comm_t *c, int *dialed, int *accepted);

/* Element types and reductions of comm_allreduce. COMM_BF16 is bfloat16 (the upper half of
 * a float32), reduced in float32 and rounded to nearest even, as torch does. */
typedef enum { COMM_F32 = 0, COMM_F64, COMM_BF16, COMM_I64 } comm_dtype;
typedef enum { COMM_SUM = 0, COMM_MEAN, COMM_MAX, COMM_MIN } comm_op;
size_t comm_dtype_size(comm_dtype t); /* bytes per element, 0 for an unknown type */

/* In-place reduction over all ranks of buf[0..n) elements of `type`, on the ring (fixed
 * operand order: the same bits on every rank, whatever the timing). COMM_MEAN is the sum
 * times 1 / size (float types, as comm_allreduce_mean) or the sum divided by size (int64,
 * truncated). Max and min of a NaN: the NaN. */
comm_status comm_allreduce(comm_t *c, void *buf, size_t n, comm_dtype type, comm_op op, int timeout_ms);
/* In-place sum over all ranks of buf[0..n). */
comm_status comm_allreduce_sum(comm_t *c, float *buf, size_t n, int timeout_ms);
/* In-place mean: the sum above, then every element multiplied by inv = 1.0f / (float)size
 * (one float division, then one float multiplication per element: the same bits on every
 * rank, and for a size that is not a power of two possibly 1 ulp from sum / size). */
comm_status comm_allreduce_mean(comm_t *c, float *buf, size_t n, int timeout_ms);
/* out[r*n .. (r+1)*n) = rank r's in[0..n) for every r. in may alias out + rank*n. */
comm_status comm_allgather(comm_t *c, const float *in, float *out, size_t n, int timeout_ms);
/* Root's buf[0..nbytes) copied to every rank. */
comm_status comm_broadcast(comm_t *c, void *buf, size_t nbytes, int root, int timeout_ms);
comm_status comm_barrier(comm_t *c, int timeout_ms);

/* A communicator among some of the epoch's ranks (a tensor-, pipeline- or data-parallel group),
 * built as comm_create builds one, under its own prefix, with rank and size within the group.
 * It has no abort watcher of its own: comm_abort of `parent` (from the parent's watcher or
 * anyone) aborts it too, so a closed epoch ends a group's operation in flight as promptly as a
 * collective of the whole epoch. Destroy it before the parent. */
comm_t *comm_create_group(comm_t *parent, const comm_store_addr *store, const char *prefix, int rank, int size,
                          const char *bind_host, int timeout_ms, char *err, size_t errlen);

/* Point to point, for pipelines. comm_send posts buf[0..nbytes) for rank dst under `tag` and
 * returns at once: the bytes leave when dst posts the matching receive (Gloo's rendezvous), so
 * a send that waited for that could deadlock two stages sending to each other; buf must stay
 * unchanged until comm_wait_sends returns. Messages between two ranks under one tag arrive in
 * the order sent. */
comm_status comm_send(comm_t *c, const void *buf, size_t nbytes, int dst, uint32_t tag);
comm_status comm_recv(comm_t *c, void *buf, size_t nbytes, int src, uint32_t tag, int timeout_ms);
/* Waits until every send posted so far has left. */
comm_status comm_wait_sends(comm_t *c, int timeout_ms);

/* Text of the last error on this communicator (the Gloo message), "" if none. */
const char *comm_last_error(const comm_t *c);
const char *comm_status_str(comm_status s);

#ifdef __cplusplus
}
#endif

#endif
