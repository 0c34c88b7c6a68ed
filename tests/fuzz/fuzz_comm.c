/* fuzz_comm.c — the data plane's handshake and frame parsers (src/data/comm_auth.c), which the
 * transport (comm_gloo_transport.cc) runs on every byte a connection brings in.
 *
 * Input: one byte of flags, then the stream.
 *   Without 0x01 the first bytes go raw to the parsers as a stranger's would: as a HELLO
 *   (accepted exactly when it is 36 bytes that start with the magic), as a PROOF to an acceptor
 *   of the fuzz job and as a CONFIRM to a dialer (never accepted: the input has no key).
 *   Then a handshake of the fuzz job between ranks the input picks, under a prefix it picks,
 *   with one byte of the PROOF or the CONFIRM flipped when the input says so: it must succeed
 *   exactly when the ranks are a pair of the communicator and nothing was flipped.
 *   Then frames on that connection, one record each, until one is refused (as the transport
 *   closes the connection at its first refusal):
 *     op & 1 == 0  40 raw bytes from the input as a frame head: never opens (no key);
 *     op & 1 == 1  a frame sealed by the sender's session: type (any byte), slot (8 bytes),
 *                  payload length (2 bytes, as much as the input has), one bit of head,
 *                  payload or tag to flip (2 bytes; 0 = none), the receiver's bound on DATA
 *                  (2 bytes) and where its reads split the payload (1 byte). Unflipped it
 *                  opens with exactly the sealed fields when the type is one of the protocol's
 *                  and the length within the bound (malformed otherwise), its payload checks
 *                  out; flipped it is refused where the flip is (head: bad tag; payload or tag:
 *                  the payload check fails). */
#include "fuzz_util.h"

#include <sodium.h>

#include "comm_auth.h"

#define FUZZ_SECRET "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static unsigned char key[COMM_KEY_BYTES];

typedef struct {
    const uint8_t *p;
    size_t n;
} Input;

static size_t take(Input *in, void *out, size_t want) {
    size_t k = want < in->n ? want : in->n;
    if (k) memcpy(out, in->p, k);
    if (k < want) memset((unsigned char *)out + k, 0, want - k);
    in->p += k;
    in->n -= k;
    return k;
}

static unsigned get8(Input *in) {
    unsigned char b = 0;
    take(in, &b, 1);
    return b;
}
static unsigned get16(Input *in) {
    unsigned char b[2];
    take(in, b, 2);
    return (unsigned)b[0] | ((unsigned)b[1] << 8);
}

static void raw_handshake(Input *in) {
    unsigned char buf[COMM_HS_PROOF_BYTES];
    size_t k = take(in, buf, sizeof buf);
    comm_hs hs = {0};
    hs.size = 4;
    hs.acceptor = 1;
    snprintf(hs.prefix, sizeof hs.prefix, "fuzz/e/1");
    randombytes_buf(hs.na, sizeof hs.na);
    for (size_t len = 0; len <= k; len += (len < 8 ? 1 : 16)) {
        int r = comm_hs_parse_hello(&hs, buf, len);
        FUZZ_CHECK((r == COMM_HS_OK) == (len == COMM_HS_HELLO_BYTES && memcmp(buf, "DPC1", 4) == 0),
                   "parse_hello(%zu bytes) gave %d", len, r);
        r = comm_hs_check_proof(&hs, key, buf, len);
        FUZZ_CHECK(r != COMM_HS_OK, "a proof from the input (%zu bytes, no key) was accepted", len);
        FUZZ_CHECK(hs.acceptor == 1 && hs.size == 4, "a refused proof changed the handshake state");
        r = comm_hs_check_confirm(&hs, key, buf, len);
        FUZZ_CHECK(r != COMM_HS_OK, "a confirmation from the input (%zu bytes, no key) was accepted", len);
    }
}

/* Returns 1 with both sessions when the handshake succeeded. */
static int handshake(Input *in, comm_session *sd, comm_session *sa) {
    comm_hs acc = {0}, dia = {0};
    unsigned size = get8(in) % 9 + 1, d = get8(in) % 10, a = get8(in) % 10, plen = get8(in) % 80;
    unsigned flip = get16(in);
    char prefix[81] = "";
    take(in, prefix, plen);
    prefix[plen] = 0;
    acc.size = dia.size = size;
    acc.acceptor = dia.acceptor = a;
    dia.dialer = d;
    snprintf(acc.prefix, sizeof acc.prefix, "%s", prefix);
    snprintf(dia.prefix, sizeof dia.prefix, "%s", prefix);
    unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES], conf[COMM_HS_CONFIRM_BYTES];
    comm_hs_hello(&acc, hello);
    FUZZ_CHECK(comm_hs_parse_hello(&dia, hello, sizeof hello) == COMM_HS_OK, "our own hello refused");
    comm_hs_proof(&dia, key, proof);
    /* flip: 0 none; 1..72*8 a bit of the proof; then a bit of the confirmation */
    unsigned fp = flip % (1 + 8 * (COMM_HS_PROOF_BYTES + COMM_HS_CONFIRM_BYTES) + 200);
    int flipped_proof = fp >= 1 && fp <= 8 * COMM_HS_PROOF_BYTES;
    int flipped_conf = fp > 8 * COMM_HS_PROOF_BYTES && fp <= 8 * (COMM_HS_PROOF_BYTES + COMM_HS_CONFIRM_BYTES);
    if (flipped_proof) proof[(fp - 1) / 8] ^= (unsigned char)(1u << ((fp - 1) % 8));
    int r = comm_hs_check_proof(&acc, key, proof, sizeof proof);
    int pair = a < size && d < size && d != a;
    if (flipped_proof) {
        FUZZ_CHECK(r != COMM_HS_OK, "a proof with bit %u flipped was accepted", fp - 1);
        return 0;
    }
    FUZZ_CHECK((r == COMM_HS_OK) == pair, "proof of %u -> %u (size %u) gave %d", d, a, size, r);
    if (r != COMM_HS_OK) {
        FUZZ_CHECK(r == COMM_HS_BAD_RANK, "a proof with wrong ranks gave %d, not BAD_RANK", r);
        return 0;
    }
    FUZZ_CHECK(acc.dialer == d && memcmp(acc.nd, dia.nd, COMM_NONCE_BYTES) == 0, "acceptor's view of the dialer wrong");
    comm_hs_confirm(&acc, key, conf);
    if (flipped_conf) {
        unsigned bit = fp - 1 - 8 * COMM_HS_PROOF_BYTES;
        conf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    r = comm_hs_check_confirm(&dia, key, conf, sizeof conf);
    FUZZ_CHECK((r == COMM_HS_OK) == !flipped_conf, "confirmation (flipped %d) gave %d", flipped_conf, r);
    if (r != COMM_HS_OK) return 0;
    comm_hs_session(&dia, key, 1, sd);
    comm_hs_session(&acc, key, 0, sa);
    FUZZ_CHECK(memcmp(sd->tx, sa->rx, 32) == 0 && memcmp(sd->rx, sa->tx, 32) == 0, "session keys do not pair up");
    return 1;
}

static void frames(Input *in, comm_session *tx, comm_session *rx) {
    static unsigned char payload[65536 + COMM_FRAME_TAG_BYTES];
    while (in->n > 0) {
        unsigned op = get8(in);
        unsigned char head[COMM_FRAME_HEAD_BYTES];
        comm_frame f, g;
        crypto_onetimeauth_state ps, pr;
        if ((op & 1) == 0) {
            take(in, head, sizeof head);
            uint64_t seq = rx->rx_seq;
            int r = comm_frame_open(rx, head, UINT64_MAX, &g, &pr);
            FUZZ_CHECK(r == COMM_FRAME_BAD_TAG && rx->rx_seq == seq, "a frame head from the input (no key) gave %d", r);
            return;
        }
        f.type = (int)get8(in);
        take(in, &f.slot, sizeof f.slot);
        unsigned len = get16(in), flip = get16(in), bound = get16(in), split = get8(in);
        f.nbytes = f.type == COMM_FRAME_DATA ? len : (uint64_t)len << 20; /* RECV_READY may name any size */
        size_t plen = f.type == COMM_FRAME_DATA ? take(in, payload, len) : 0;
        if (f.type == COMM_FRAME_DATA) f.nbytes = plen;
        comm_frame_seal(tx, &f, head, &ps);
        int data = f.type == COMM_FRAME_DATA;
        if (data) {
            crypto_onetimeauth_update(&ps, payload, plen);
            comm_frame_payload_tag(&ps, payload + plen);
        }
        size_t span = COMM_FRAME_HEAD_BYTES + (data ? plen + COMM_FRAME_TAG_BYTES : 0);
        size_t fb = flip ? (size_t)(flip - 1) % (8 * span) : 0;
        if (flip) {
            if (fb / 8 < COMM_FRAME_HEAD_BYTES) head[fb / 8] ^= (unsigned char)(1u << (fb % 8));
            else payload[fb / 8 - COMM_FRAME_HEAD_BYTES] ^= (unsigned char)(1u << (fb % 8));
        }
        uint64_t seq = rx->rx_seq;
        int r = comm_frame_open(rx, head, bound, &g, &pr);
        if (flip && fb / 8 < COMM_FRAME_HEAD_BYTES) {
            FUZZ_CHECK(r == COMM_FRAME_BAD_TAG && rx->rx_seq == seq, "a head with bit %zu flipped gave %d", fb, r);
            return;
        }
        int known = f.type == COMM_FRAME_DATA || f.type == COMM_FRAME_RECV_READY;
        if (!known || (data && plen > bound)) {
            FUZZ_CHECK(r == COMM_FRAME_MALFORMED && rx->rx_seq == seq, "frame type %d, %zu bytes (bound %u) gave %d", f.type,
                       plen, bound, r);
            return;
        }
        FUZZ_CHECK(r == COMM_FRAME_OK && rx->rx_seq == seq + 1, "a sealed frame gave %d", r);
        FUZZ_CHECK(g.type == f.type && g.slot == f.slot && g.nbytes == f.nbytes, "the frame opened with other fields");
        if (!data) continue;
        size_t cut = plen ? (size_t)split * plen / 255 : 0;
        crypto_onetimeauth_update(&pr, payload, cut);
        crypto_onetimeauth_update(&pr, payload + cut, plen - cut);
        int ok = comm_frame_payload_check(&pr, payload + plen) == 0;
        FUZZ_CHECK(ok == !flip, "payload of %zu bytes (bit %zu flipped: %d) checked %d", plen, fb, flip != 0, ok);
        if (!ok) return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        FUZZ_CHECK(sodium_init() >= 0 && comm_key_derive(FUZZ_SECRET, key) == 0, "setup");
        ready = 1;
    }
    Input in = {data, size};
    unsigned flags = get8(&in);
    if (!(flags & 1)) raw_handshake(&in);
    comm_session sd, sa;
    if (!handshake(&in, &sd, &sa)) return 0;
    /* the dialer's frames to the acceptor, or the other way */
    if (flags & 2) frames(&in, &sa, &sd);
    else frames(&in, &sd, &sa);
    return 0;
}
