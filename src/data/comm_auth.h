/* comm_auth.h — the data plane's wire format: the handshake that every connection between two
 * ranks of a communicator runs before it carries a byte of a collective, and the authenticated
 * frames that follow. Pure functions over byte buffers (libsodium; no sockets, no state beyond
 * the caller's), so that the transport (comm_gloo_transport.cc), the unit tests and the fuzzer
 * all drive the same code. The protocol is described in docs/DESIGN.md ("The data plane's
 * connections") and below.
 *
 * K is the job's data-plane key (comm_key_derive: crypto_kdf_derive_from_key(id 1, context
 * "DPcomm01", the job's secret), independent of the replica channel's key). MAC(k, m) is
 * crypto_auth (HMAC-SHA-512-256), always checked in constant time.
 *
 * Handshake on a connection that rank D (the dialer, the higher rank) opened to the listener of
 * rank A (the acceptor) for the communicator whose store prefix is P and size is N:
 *   A -> D  HELLO    "DPC1", Na (32 random bytes)                                 36 bytes
 *   D -> A  PROOF    u32 D, u32 A, Nd (32 random bytes), MAC(K, "DPC1 dialer" || T)  72 bytes
 *   A -> D  CONFIRM  MAC(K, "DPC1 acceptor" || T)                                  32 bytes
 * with T = u32 N || u32 D || u32 A || Na || Nd || P (integers little endian). A checks PROOF
 * (D a rank of the communicator other than A, A itself, the MAC) before it sends another byte;
 * D checks CONFIRM before it sends a frame. Na makes a recorded PROOF worthless on any other
 * connection, Nd a recorded CONFIRM. The acceptor proves nothing to a party that has not proved
 * K first: a stranger learns Na, 32 random bytes, and nothing else.
 * Session: S = MAC(K, "DPC1 session" || T); the frames from D to A are keyed by
 * crypto_kdf_derive_from_key(id 1, "DPcsess1", S), those from A to D by id 2.
 *
 * Frames. Each direction numbers its frames 0, 1, 2, ... (seq). Frame keys:
 * hk || pk = crypto_kdf_derive_from_key(64 bytes, id seq, context "DPcframe", direction key).
 *   header   u8 type, 7 zero bytes, u64 slot, u64 nbytes                           24 bytes
 *   tag      Poly1305(hk, header)  (crypto_onetimeauth)                              16 bytes
 * and, for DATA frames only:
 *   payload  nbytes bytes
 *   tag      Poly1305(pk, payload)                                                   16 bytes
 * Every one-time key is used once (seq never repeats on a connection, whose direction keys are
 * fresh), so a frame cannot be forged, changed, replayed, reordered or moved to another
 * connection. A receiver acts on a header only after its tag checks out, and completes a
 * receive only after the payload's tag does; a bad tag ends the connection (the communicator
 * then fails). Nothing is encrypted. */
#ifndef DEADPOOL_COMM_AUTH_H
#define DEADPOOL_COMM_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COMM_KEY_BYTES 32
#define COMM_NONCE_BYTES 32
#define COMM_HS_HELLO_BYTES (4 + COMM_NONCE_BYTES)
#define COMM_HS_PROOF_BYTES (8 + COMM_NONCE_BYTES + 32)
#define COMM_HS_CONFIRM_BYTES 32
#define COMM_PREFIX_MAX 512 /* the longest store prefix a handshake binds */

#define COMM_FRAME_HDR_BYTES 24
#define COMM_FRAME_TAG_BYTES 16
#define COMM_FRAME_HEAD_BYTES (COMM_FRAME_HDR_BYTES + COMM_FRAME_TAG_BYTES)
#define COMM_FRAME_RECV_READY 'R' /* the sender's receive for slot is posted: nbytes fit */
#define COMM_FRAME_DATA 'D'       /* nbytes of payload for the oldest receive posted on slot */

/* The data-plane key of the job whose secret is secret_hex (64 hex digits): 0, or -1 when the
 * secret is not 64 hex digits. */
int comm_key_derive(const char *secret_hex, unsigned char key[COMM_KEY_BYTES]);

/* What both ends of one connection agree on, and what the handshake gives them. */
typedef struct {
    uint32_t size, dialer, acceptor;
    unsigned char na[COMM_NONCE_BYTES], nd[COMM_NONCE_BYTES];
    char prefix[COMM_PREFIX_MAX + 1];
} comm_hs;

typedef struct {
    unsigned char tx[32], rx[32]; /* this end's direction keys */
    uint64_t tx_seq, rx_seq;
} comm_session;

typedef enum {
    COMM_HS_OK = 0,
    COMM_HS_MALFORMED = -1, /* wrong magic or length */
    COMM_HS_BAD_RANK = -2,  /* the ranks named are not this connection's */
    COMM_HS_BAD_MAC = -3    /* the proof does not check out: no key, another job or prefix, a replay */
} comm_hs_result;

const char *comm_hs_result_str(int r);

/* Acceptor: draws Na into hs->na and writes HELLO. hs's prefix, size and acceptor must be set. */
void comm_hs_hello(comm_hs *hs, unsigned char out[COMM_HS_HELLO_BYTES]);
/* Dialer: reads Na from HELLO into hs->na. */
int comm_hs_parse_hello(comm_hs *hs, const unsigned char *in, size_t len);
/* Dialer: draws Nd into hs->nd and writes PROOF (hs: prefix, size, dialer, acceptor, na set). */
void comm_hs_proof(comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], unsigned char out[COMM_HS_PROOF_BYTES]);
/* Acceptor: checks PROOF against hs (prefix, size, acceptor, na); on COMM_HS_OK, hs->dialer
 * and hs->nd are the dialer's. */
int comm_hs_check_proof(comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], const unsigned char *in, size_t len);
/* Acceptor: CONFIRM for the checked hs. Dialer: checks it. */
void comm_hs_confirm(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], unsigned char out[COMM_HS_CONFIRM_BYTES]);
int comm_hs_check_confirm(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], const unsigned char *in, size_t len);
/* Both: the session's direction keys, sequence numbers at 0. */
void comm_hs_session(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], int is_dialer, comm_session *s);

typedef struct {
    int type; /* COMM_FRAME_RECV_READY or COMM_FRAME_DATA */
    uint64_t slot, nbytes;
} comm_frame;

/* Seals the next frame of s (its tx_seq, then incremented) into out: header and its tag. For a
 * DATA frame, *payload is set up for the payload's tag (crypto_onetimeauth_update over the
 * payload, then comm_frame_payload_tag). */
void comm_frame_seal(comm_session *s, const comm_frame *f, unsigned char out[COMM_FRAME_HEAD_BYTES],
                     crypto_onetimeauth_state *payload);
void comm_frame_payload_tag(crypto_onetimeauth_state *payload, unsigned char tag[COMM_FRAME_TAG_BYTES]);

typedef enum {
    COMM_FRAME_OK = 0,
    COMM_FRAME_BAD_TAG = -1,  /* forged, changed, replayed or out of order */
    COMM_FRAME_MALFORMED = -2 /* a type this protocol does not have, padding not zero, too long */
} comm_frame_result;

const char *comm_frame_result_str(int r);

/* Opens the next frame of s (its rx_seq, incremented only on success) from in (the 40 bytes
 * of header and tag): COMM_FRAME_OK with *f filled, and for DATA *payload set up for the
 * payload's tag. A DATA frame longer than max_nbytes is malformed. */
int comm_frame_open(comm_session *s, const unsigned char in[COMM_FRAME_HEAD_BYTES], uint64_t max_nbytes, comm_frame *f,
                    crypto_onetimeauth_state *payload);
/* 0 when tag is the payload's (constant time), -1 otherwise. */
int comm_frame_payload_check(crypto_onetimeauth_state *payload, const unsigned char tag[COMM_FRAME_TAG_BYTES]);

#ifdef __cplusplus
}
#endif

#endif
