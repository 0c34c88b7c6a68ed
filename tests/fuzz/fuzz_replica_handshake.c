/* fuzz_replica_handshake.c — the replica holder's side of the handshake, in-process and without
 * sockets: replica_hs_start / replica_hs_want / replica_hs_feed (src/data/replica_handshake.h),
 * the very functions replica.c's accept thread runs on every waiting connection
 * (advance_pending). No holder, no thread, no TCP: some 10^4-10^5 executions a second where
 * fuzz_replica (a fresh holder and connection per input) does about 100.
 *
 * Input: a flags byte, then the fields the flags call for, then the chunk plan, then the bytes:
 *   flags & 3   what the client answers to the hello (Nc is the first 32 bytes of the bytes):
 *               0 the bytes as they are (no proof made here), 1 a right proof: the job's key,
 *               this holder's identity, 2 the job's key but another holder's identity (a client
 *               relayed to this holder), 3 another job's key, this holder's identity; with 1-3
 *               the rest of the bytes follow the 64-byte answer (a first request sent at once)
 *   0x04        one byte of the answer made with 1-3 is altered: 2 bytes, position and XOR mask
 *   0x08        the peer closes its end after the last chunk
 *   0x10        the holder's identity is 299 characters long (the longest replica.c builds)
 *   0x20        Nh (the holder's nonce) is the next 32 bytes; else a fixed one
 *   0x40        every call offers at most replica_hs_want() bytes, as advance_pending's recv
 *               does; else every byte that arrived and was not consumed yet
 *   then        k (1 byte) and k chunk sizes (1 byte each): the bytes arrive in chunks of those
 *               sizes, 0 meaning "the peer closes here"; what the plan leaves arrives at once
 * After each chunk the harness feeds the holder as poll would wake it (until nothing that arrived
 * is left unconsumed or the verdict is in), each time from a buffer of exactly the bytes offered
 * (malloc'd apart from the input: ASan sees any read past them).
 *
 * Checked on every call, against the harness's own computation of the proofs (libsodium's
 * crypto_auth over label || Nh || Nc || I, written here again, not taken from replica.c):
 *   - the hello is "DPR2" || Nh;
 *   - it consumes exactly min(offered, replica_hs_want()) bytes (never beyond what arrived,
 *     never past the 64-byte answer: what follows belongs to the connection's thread; never less,
 *     since advance_pending's recv already took them off the socket);
 *   - ACCEPT only with all 64 bytes consumed and a proof that holds for this holder's key and
 *     identity; then the holder's proof and the session key are exactly right;
 *   - a complete answer whose proof holds is accepted (no valid client is turned away);
 *   - REFUSE always has a reason, and only for a peer that closed early or a proof that fails;
 *   - the output is untouched unless it accepts; a decided verdict is final (more bytes or a
 *     close consume nothing, change nothing); 64 bytes arrived means a verdict. */
#include "fuzz_util.h"

#include <sodium.h>

#include "replica.h"
#include "replica_handshake.h"

#define FUZZ_SECRET "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define OTHER_SECRET "f0e0d0c0b0a090807060504030201000f0e0d0c0b0a090807060504030201000"
#define NONCE 32
#define TAG 32
#define ANSWER (NONCE + TAG)

static unsigned char key[REPLICA_KEY_BYTES], other_key[REPLICA_KEY_BYTES];
static char id_short[64], id_long[300], relay_short[64], relay_long[300];

static void init_once(void) {
    static int done;
    if (done) return;
    done = 1;
    FUZZ_CHECK(sodium_init() >= 0, "libsodium");
    FUZZ_CHECK(replica_key_derive(FUZZ_SECRET, key) == 0, "replica_key_derive");
    FUZZ_CHECK(replica_key_derive(OTHER_SECRET, other_key) == 0, "replica_key_derive");
    snprintf(id_short, sizeof id_short, "5@127.0.0.1:7070");
    snprintf(relay_short, sizeof relay_short, "6@127.0.0.1:7070");
    /* "PROC@HOST:PORT" at replica.c's longest: 299 characters (HOLDER_ID_MAX 300 with the NUL) */
    char host[300 - sizeof "5@:65535" + 1]; /* exactly the host that fits, so the compiler sees it does */
    memset(host, 'h', sizeof host);
    host[sizeof host - 1] = 0;
    snprintf(id_long, sizeof id_long, "5@%s:65535", host);
    snprintf(relay_long, sizeof relay_long, "6@%s:65535", host);
    FUZZ_CHECK(strlen(id_long) == 299 && strlen(relay_long) == 299, "identity length");
}

/* MAC(k, label || nh || nc || id), as replica.c's file comment specifies the proofs and Ks. */
static void mac_label(unsigned char out[TAG], const unsigned char *k, const char *label, const unsigned char *nh,
                      const unsigned char *nc, const char *id) {
    unsigned char in[32 + 2 * NONCE + 300];
    size_t n = strlen(label), m = strlen(id);
    memcpy(in, label, n);
    memcpy(in + n, nh, NONCE);
    memcpy(in + n + NONCE, nc, NONCE);
    memcpy(in + n + 2 * NONCE, id, m);
    crypto_auth(out, in, n + 2 * NONCE + m, k);
}

/* Reads the input's fields front to back; past its end, zeros. */
typedef struct {
    const uint8_t *p;
    size_t n;
} Reader;

static uint8_t take_byte(Reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static void take(Reader *r, unsigned char *out, size_t len) {
    size_t k = len < r->n ? len : r->n;
    if (k) memcpy(out, r->p, k);
    memset(out + k, 0, len - k);
    r->p += k, r->n -= k;
}

/* One handshake under test and what the harness knows about it. */
typedef struct {
    ReplicaHandshake h;
    const char *id;             /* this holder's identity */
    const unsigned char *s;     /* the bytes the peer sends */
    size_t len;
    size_t arrived, consumed;   /* of s */
    int valid;                  /* s[0..64) is a proof that holds for key and id (the harness's own check) */
    unsigned char proof[TAG], ks[TAG]; /* what an ACCEPT must yield */
    int at_most_want;           /* flag 0x40 */
} Run;

static const unsigned char UNTOUCHED = 0xa5;

static int untouched(const ReplicaHsAccept *a) {
    const unsigned char *b = (const unsigned char *)a;
    for (size_t i = 0; i < sizeof *a; i++)
        if (b[i] != UNTOUCHED) return 0;
    return 1;
}

enum { OFFER, CLOSE, LATE };

/* One call of replica_hs_feed: OFFER the bytes that arrived and are not consumed yet (all, or
 * at most what it wants), CLOSE (n == 0: the peer closed), or LATE: one byte more, as if it came
 * after the verdict. */
static void feed(Run *r, int what) {
    size_t want = replica_hs_want(&r->h);
    replica_hs_verdict before = r->h.verdict;
    size_t n = what == CLOSE ? 0 : what == LATE ? 1 : r->arrived - r->consumed;
    if (what == OFFER && r->at_most_want && n > want) n = want;
    unsigned char *buf = malloc(n ? n : 1); /* exactly the bytes offered, apart from the input */
    FUZZ_CHECK(buf != NULL, "out of memory");
    if (what == LATE) buf[0] = r->consumed < r->len ? r->s[r->consumed] : 0x5a;
    else if (n) memcpy(buf, r->s + r->consumed, n);
    ReplicaHsAccept acc;
    memset(&acc, UNTOUCHED, sizeof acc);
    size_t used = (size_t)-1;
    replica_hs_verdict v = replica_hs_feed(&r->h, key, r->id, buf, n, &used, &acc);
    free(buf);
    FUZZ_CHECK(v == REPLICA_HS_MORE || v == REPLICA_HS_ACCEPT || v == REPLICA_HS_REFUSE, "verdict %d", (int)v);
    FUZZ_CHECK(v == r->h.verdict, "returned %d, state says %d", (int)v, (int)r->h.verdict);
    FUZZ_CHECK(used <= n, "consumed %zu of the %zu bytes offered", used, n);
    if (before != REPLICA_HS_MORE) { /* decided: final */
        FUZZ_CHECK(used == 0 && v == before && untouched(&acc), "a decided handshake (%d) changed: %zu bytes taken, now %d",
                   (int)before, used, (int)v);
        FUZZ_CHECK(want == 0, "a decided handshake wants %zu bytes", want);
        return;
    }
    FUZZ_CHECK(want == ANSWER - r->consumed, "wants %zu bytes with %zu of the answer consumed", want, r->consumed);
    size_t expect = n < want ? n : want;
    FUZZ_CHECK(used == expect, "consumed %zu bytes, %zu offered, %zu wanted", used, n, want);
    r->consumed += used;
    FUZZ_CHECK(r->consumed <= ANSWER, "consumed %zu bytes: beyond the answer", r->consumed);
    switch (v) {
    case REPLICA_HS_MORE:
        FUZZ_CHECK(n > 0 && r->consumed < ANSWER, "MORE after %zu bytes (offered %zu)", r->consumed, n);
        FUZZ_CHECK(untouched(&acc), "output written without an accept");
        FUZZ_CHECK(replica_hs_want(&r->h) == ANSWER - r->consumed, "wants %zu after %zu", replica_hs_want(&r->h),
                   r->consumed);
        break;
    case REPLICA_HS_ACCEPT:
        FUZZ_CHECK(r->consumed == ANSWER, "accepted after %zu bytes", r->consumed);
        FUZZ_CHECK(r->valid, "accepted an answer whose proof does not hold for this holder's key and identity");
        FUZZ_CHECK(memcmp(acc.proof, r->proof, TAG) == 0, "the holder's proof is wrong");
        FUZZ_CHECK(memcmp(acc.ks, r->ks, TAG) == 0, "the session key is wrong");
        FUZZ_CHECK(replica_hs_want(&r->h) == 0, "an accepted handshake wants more");
        break;
    case REPLICA_HS_REFUSE:
        FUZZ_CHECK(r->h.why != NULL && r->h.why[0] != 0, "a refusal without a reason");
        FUZZ_CHECK(untouched(&acc), "output written on a refusal");
        FUZZ_CHECK((n == 0 && r->consumed < ANSWER) || (r->consumed == ANSWER && !r->valid),
                   "refused (%s) after %zu bytes, offered %zu, proof %s", r->h.why, r->consumed, n,
                   r->valid ? "valid" : "invalid");
        FUZZ_CHECK(replica_hs_want(&r->h) == 0, "a refused handshake wants more");
        break;
    }
}

/* What poll reports after bytes arrived: calls until nothing is left unconsumed or decided. */
static void wake(Run *r) {
    while (r->h.verdict == REPLICA_HS_MORE && r->consumed < r->arrived) {
        size_t before = r->consumed;
        feed(r, OFFER);
        FUZZ_CHECK(r->consumed > before || r->h.verdict != REPLICA_HS_MORE, "no progress");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init_once();
    Reader in = {data, size};
    unsigned flags = take_byte(&in);
    unsigned mode = flags & 3;
    unsigned char pos = 0, mask = 0, nh[NONCE];
    if (flags & 0x04) {
        pos = take_byte(&in);
        mask = take_byte(&in);
    }
    if (flags & 0x20) take(&in, nh, NONCE);
    else
        for (int i = 0; i < NONCE; i++) nh[i] = (unsigned char)(0x40 + i);
    unsigned k = take_byte(&in);
    unsigned char plan[256];
    if (k > in.n) k = (unsigned)in.n; /* a plan cut short by the input's end is shorter */
    take(&in, plan, k);

    Run r;
    memset(&r, 0, sizeof r);
    r.id = (flags & 0x10) ? id_long : id_short;
    r.at_most_want = (flags & 0x40) != 0;
    /* the bytes the peer sends */
    unsigned char *s = NULL;
    size_t len;
    if (mode == 0) {
        len = in.n;
        s = malloc(len ? len : 1);
        FUZZ_CHECK(s != NULL, "out of memory");
        if (len) memcpy(s, in.p, len);
    } else {
        unsigned char nc[NONCE];
        take(&in, nc, NONCE);
        len = ANSWER + in.n;
        s = malloc(len);
        FUZZ_CHECK(s != NULL, "out of memory");
        const char *meant = mode == 2 ? ((flags & 0x10) ? relay_long : relay_short) : r.id;
        memcpy(s, nc, NONCE);
        mac_label(s + NONCE, mode == 3 ? other_key : key, "DPrepl02 client", nh, nc, meant);
        if (flags & 0x04) s[pos % ANSWER] ^= mask ? mask : 1;
        if (in.n) memcpy(s + ANSWER, in.p, in.n);
    }
    r.s = s;
    r.len = len;
    if (len >= ANSWER) { /* the harness's own verdict on the answer, and what an accept must yield */
        unsigned char want[TAG];
        mac_label(want, key, "DPrepl02 client", nh, s, r.id);
        r.valid = crypto_verify_32(want, s + NONCE) == 0;
        mac_label(r.proof, key, "DPrepl02 holder", nh, s, r.id);
        mac_label(r.ks, key, "DPrepl02 session", nh, s, r.id);
        FUZZ_CHECK(!(mode == 1 && !(flags & 0x04)) || r.valid, "the harness's own proof does not hold");
    }

    replica_hs_start(&r.h, nh);
    FUZZ_CHECK(memcmp(r.h.hello, "DPR2", 4) == 0 && memcmp(r.h.hello + 4, nh, NONCE) == 0, "the hello is not DPR2 || Nh");
    FUZZ_CHECK(r.h.verdict == REPLICA_HS_MORE && replica_hs_want(&r.h) == ANSWER, "a fresh handshake wants %zu",
               replica_hs_want(&r.h));

    int closed = 0;
    for (unsigned i = 0; i < k && !closed; i++) {
        if (plan[i] == 0) { /* the peer closes here */
            wake(&r);
            feed(&r, CLOSE);
            closed = 1;
            break;
        }
        r.arrived += plan[i];
        if (r.arrived > len) r.arrived = len;
        wake(&r);
    }
    if (!closed) {
        r.arrived = len; /* the rest at once */
        wake(&r);
        if (flags & 0x08) {
            feed(&r, CLOSE);
            closed = 1;
        }
    }
    /* a decided handshake stays decided: a byte more, and a close */
    if (r.h.verdict != REPLICA_HS_MORE) {
        feed(&r, LATE);
        feed(&r, CLOSE);
    }
    if (r.arrived >= ANSWER || closed) FUZZ_CHECK(r.h.verdict != REPLICA_HS_MORE, "64 bytes arrived, or the peer closed, and no verdict");
    if (r.h.verdict == REPLICA_HS_MORE) FUZZ_CHECK(r.consumed == r.arrived && r.consumed < ANSWER, "undecided");
    if (r.h.verdict == REPLICA_HS_ACCEPT) FUZZ_CHECK(r.consumed == ANSWER, "the first request was consumed");
    free(s);
    return 0;
}
