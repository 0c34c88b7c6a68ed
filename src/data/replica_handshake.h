/* replica_handshake.h — the holder's side of the replica channel's handshake (replica.c's file
 * comment) as a pure state machine: bytes in, a verdict out; no socket, no clock, no randomness.
 * replica_serve.c's accept thread runs every waiting connection's handshake through it (the socket,
 * the 2 s deadline and the cap on waiting connections stay there), and
 * tests/fuzz/fuzz_replica_handshake.c drives it directly, in chunks the fuzzer chooses.
 * Internal to the library: not part of include/deadpool.h. */
#ifndef DEADPOOL_REPLICA_HANDSHAKE_H
#define DEADPOOL_REPLICA_HANDSHAKE_H

#include <stddef.h>

#define REPLICA_HELLO_BYTES 36  /* holder -> client: "DPR2", Nh (32 bytes) */
#define REPLICA_ANSWER_BYTES 64 /* client -> holder: Nc (32 bytes), MAC(K, "DPrepl02 client" || Nh || Nc || I) */
#define REPLICA_PROOF_BYTES 32  /* holder -> client: MAC(K, "DPrepl02 holder" || Nh || Nc || I) */

typedef enum {
    REPLICA_HS_MORE = 0,    /* the answer is not complete yet: wait for more bytes */
    REPLICA_HS_ACCEPT = 1,  /* the client proved the key for this holder: send the proof */
    REPLICA_HS_REFUSE = -1  /* close the connection; `why` says why */
} replica_hs_verdict;

/* One connection's handshake, on the holder's side. */
typedef struct {
    unsigned char hello[REPLICA_HELLO_BYTES];   /* what the holder sends first */
    unsigned char answer[REPLICA_ANSWER_BYTES]; /* the client's answer, as far as received */
    size_t got;                                 /* bytes of answer received */
    replica_hs_verdict verdict;                 /* REPLICA_HS_MORE until decided, then final */
    const char *why;                            /* REPLICA_HS_REFUSE: the reason (static text) */
} ReplicaHandshake;

/* What an accepted handshake yields. */
typedef struct {
    unsigned char proof[REPLICA_PROOF_BYTES]; /* to send to the client */
    unsigned char ks[32];                     /* the session key Ks (replica.c) */
} ReplicaHsAccept;

/* Starts a handshake whose holder nonce is nh (the caller draws it: randombytes_buf). */
void replica_hs_start(ReplicaHandshake *h, const unsigned char nh[32]);

/* The most bytes the holder may read now: the rest of the client's answer (0 once decided).
 * Whatever follows the answer is the first request, for the connection's thread. */
size_t replica_hs_want(const ReplicaHandshake *h);

/* Takes the bytes in[0..n) that arrived, n == 0 meaning the peer closed its end (what recv
 * returning 0 means). Consumes at most replica_hs_want(h) of them (*used says how many: bytes
 * beyond the answer are left to the caller) and returns the verdict. Once the answer is complete
 * it is checked in constant time against this holder's key and identity id ("PROC@HOST:PORT");
 * only when it holds does it return REPLICA_HS_ACCEPT and fill *out. A refusal sets h->why.
 * Once decided the verdict is final: later calls consume nothing, leave *out alone and return it
 * again. */
replica_hs_verdict replica_hs_feed(ReplicaHandshake *h, const unsigned char *key, const char *id, const void *in,
                                   size_t n, size_t *used, ReplicaHsAccept *out);

#endif
