/* comm_auth.c — the data plane's handshake and frames (comm_auth.h). Only libsodium's
 * primitives: crypto_auth (HMAC-SHA-512-256), crypto_kdf (BLAKE2b), crypto_onetimeauth
 * (Poly1305), randombytes_buf, sodium_memcmp. */
#include "comm_auth.h"

#include <string.h>

#include "secret.h"

static const unsigned char kMagic[4] = {'D', 'P', 'C', '1'};

int comm_key_derive(const char *secret_hex, unsigned char key[COMM_KEY_BYTES]) {
    return job_key_derive(secret_hex, "DPcomm01", key, COMM_KEY_BYTES);
}

const char *comm_hs_result_str(int r) {
    switch (r) {
    case COMM_HS_OK: return "ok";
    case COMM_HS_MALFORMED: return "malformed handshake message";
    case COMM_HS_BAD_RANK: return "handshake names the wrong ranks";
    case COMM_HS_BAD_MAC: return "handshake proof does not check out (no job key, another communicator, or a replay)";
    }
    return "unknown handshake result";
}

const char *comm_frame_result_str(int r) {
    switch (r) {
    case COMM_FRAME_OK: return "ok";
    case COMM_FRAME_BAD_TAG: return "frame tag does not check out (forged, changed, replayed or out of order)";
    case COMM_FRAME_MALFORMED: return "malformed frame";
    }
    return "unknown frame result";
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* MAC(K, label || T), T as comm_auth.h defines it. */
static void hs_mac(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], const char *label,
                   unsigned char out[crypto_auth_BYTES]) {
    crypto_auth_hmacsha512256_state st;
    unsigned char ints[12];
    put32(ints, hs->size);
    put32(ints + 4, hs->dialer);
    put32(ints + 8, hs->acceptor);
    crypto_auth_hmacsha512256_init(&st, key, COMM_KEY_BYTES);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)label, strlen(label));
    crypto_auth_hmacsha512256_update(&st, ints, sizeof ints);
    crypto_auth_hmacsha512256_update(&st, hs->na, COMM_NONCE_BYTES);
    crypto_auth_hmacsha512256_update(&st, hs->nd, COMM_NONCE_BYTES);
    crypto_auth_hmacsha512256_update(&st, (const unsigned char *)hs->prefix, strnlen(hs->prefix, COMM_PREFIX_MAX));
    crypto_auth_hmacsha512256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

void comm_hs_hello(comm_hs *hs, unsigned char out[COMM_HS_HELLO_BYTES]) {
    randombytes_buf(hs->na, COMM_NONCE_BYTES);
    memcpy(out, kMagic, 4);
    memcpy(out + 4, hs->na, COMM_NONCE_BYTES);
}

int comm_hs_parse_hello(comm_hs *hs, const unsigned char *in, size_t len) {
    if (in == NULL || len != COMM_HS_HELLO_BYTES || memcmp(in, kMagic, 4) != 0) return COMM_HS_MALFORMED;
    memcpy(hs->na, in + 4, COMM_NONCE_BYTES);
    return COMM_HS_OK;
}

void comm_hs_proof(comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], unsigned char out[COMM_HS_PROOF_BYTES]) {
    randombytes_buf(hs->nd, COMM_NONCE_BYTES);
    put32(out, hs->dialer);
    put32(out + 4, hs->acceptor);
    memcpy(out + 8, hs->nd, COMM_NONCE_BYTES);
    hs_mac(hs, key, "DPC1 dialer", out + 8 + COMM_NONCE_BYTES);
}

int comm_hs_check_proof(comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], const unsigned char *in, size_t len) {
    if (in == NULL || len != COMM_HS_PROOF_BYTES) return COMM_HS_MALFORMED;
    uint32_t d = get32(in), a = get32(in + 4);
    if (a != hs->acceptor || a >= hs->size || d >= hs->size || d == a) return COMM_HS_BAD_RANK;
    comm_hs claimed = *hs;
    claimed.dialer = d;
    memcpy(claimed.nd, in + 8, COMM_NONCE_BYTES);
    unsigned char want[crypto_auth_BYTES];
    hs_mac(&claimed, key, "DPC1 dialer", want);
    int good = sodium_memcmp(want, in + 8 + COMM_NONCE_BYTES, sizeof want) == 0;
    sodium_memzero(want, sizeof want);
    if (!good) return COMM_HS_BAD_MAC;
    hs->dialer = d;
    memcpy(hs->nd, claimed.nd, COMM_NONCE_BYTES);
    return COMM_HS_OK;
}

void comm_hs_confirm(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], unsigned char out[COMM_HS_CONFIRM_BYTES]) {
    hs_mac(hs, key, "DPC1 acceptor", out);
}

int comm_hs_check_confirm(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], const unsigned char *in, size_t len) {
    if (in == NULL || len != COMM_HS_CONFIRM_BYTES) return COMM_HS_MALFORMED;
    unsigned char want[crypto_auth_BYTES];
    hs_mac(hs, key, "DPC1 acceptor", want);
    int good = sodium_memcmp(want, in, sizeof want) == 0;
    sodium_memzero(want, sizeof want);
    return good ? COMM_HS_OK : COMM_HS_BAD_MAC;
}

void comm_hs_session(const comm_hs *hs, const unsigned char key[COMM_KEY_BYTES], int is_dialer, comm_session *s) {
    unsigned char master[crypto_auth_BYTES];
    hs_mac(hs, key, "DPC1 session", master);
    /* id 1: dialer -> acceptor, id 2: acceptor -> dialer */
    crypto_kdf_derive_from_key(s->tx, sizeof s->tx, is_dialer ? 1 : 2, "DPcsess1", master);
    crypto_kdf_derive_from_key(s->rx, sizeof s->rx, is_dialer ? 2 : 1, "DPcsess1", master);
    sodium_memzero(master, sizeof master);
    s->tx_seq = 0;
    s->rx_seq = 0;
}

/* hk || pk of frame seq under a direction key. */
static void frame_keys(const unsigned char dir[32], uint64_t seq, unsigned char keys[64]) {
    crypto_kdf_derive_from_key(keys, 64, seq, "DPcframe", dir);
}

void comm_frame_seal(comm_session *s, const comm_frame *f, unsigned char out[COMM_FRAME_HEAD_BYTES],
                     crypto_onetimeauth_state *payload) {
    unsigned char keys[64];
    frame_keys(s->tx, s->tx_seq++, keys);
    memset(out, 0, COMM_FRAME_HDR_BYTES);
    out[0] = (unsigned char)f->type;
    put64(out + 8, f->slot);
    put64(out + 16, f->nbytes);
    crypto_onetimeauth(out + COMM_FRAME_HDR_BYTES, out, COMM_FRAME_HDR_BYTES, keys);
    if (f->type == COMM_FRAME_DATA && payload != NULL) crypto_onetimeauth_init(payload, keys + 32);
    sodium_memzero(keys, sizeof keys);
}

void comm_frame_payload_tag(crypto_onetimeauth_state *payload, unsigned char tag[COMM_FRAME_TAG_BYTES]) {
    crypto_onetimeauth_final(payload, tag);
}

int comm_frame_open(comm_session *s, const unsigned char in[COMM_FRAME_HEAD_BYTES], uint64_t max_nbytes, comm_frame *f,
                    crypto_onetimeauth_state *payload) {
    unsigned char keys[64];
    frame_keys(s->rx, s->rx_seq, keys);
    int good = crypto_onetimeauth_verify(in + COMM_FRAME_HDR_BYTES, in, COMM_FRAME_HDR_BYTES, keys) == 0;
    if (!good) {
        sodium_memzero(keys, sizeof keys);
        return COMM_FRAME_BAD_TAG;
    }
    static const unsigned char zero[7] = {0};
    int type = in[0];
    uint64_t nbytes = get64(in + 16);
    if ((type != COMM_FRAME_RECV_READY && type != COMM_FRAME_DATA) || memcmp(in + 1, zero, 7) != 0 ||
        (type == COMM_FRAME_DATA && nbytes > max_nbytes)) {
        sodium_memzero(keys, sizeof keys);
        return COMM_FRAME_MALFORMED;
    }
    f->type = type;
    f->slot = get64(in + 8);
    f->nbytes = nbytes;
    if (type == COMM_FRAME_DATA && payload != NULL) crypto_onetimeauth_init(payload, keys + 32);
    sodium_memzero(keys, sizeof keys);
    s->rx_seq++;
    return COMM_FRAME_OK;
}

int comm_frame_payload_check(crypto_onetimeauth_state *payload, const unsigned char tag[COMM_FRAME_TAG_BYTES]) {
    unsigned char want[COMM_FRAME_TAG_BYTES];
    crypto_onetimeauth_final(payload, want);
    int good = crypto_verify_16(want, tag) == 0;
    sodium_memzero(want, sizeof want);
    return good ? 0 : -1;
}
