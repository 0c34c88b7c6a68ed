/* fuzz_protocol.c — the control plane's values (src/control/protocol.c), read from Redis, from
 * untrusted bytes: every parser of protocol.h gets every input (as Redis hands a value over:
 * NUL-terminated, so a value with a NUL byte is cut there).
 *
 * A refusal must say why and leave a zeroed struct. What a parser accepts must hold what its
 * readers rely on (the ranges protocol.h gives), must format again (a format function
 * accepts what its parser accepts) and parse back to the same struct. */
#include "fuzz_util.h"

#include <math.h>

#include "protocol.h"

static char buf[PERSIST_REQ_TEXT_MAX];
static char err[512];

#define REFUSED(ok, s)                                                                               \
    do {                                                                                             \
        static const __typeof__(s) zero_;                                                            \
        FUZZ_CHECK(err[0] != 0, "%s refused without a message", #s);                                 \
        FUZZ_CHECK(memcmp(&(s), &zero_, sizeof(s)) == 0, "%s refused but left partly filled", #s);   \
        (void)(ok);                                                                                  \
    } while (0)

/* Accepted: formats, and parses back to the same struct. */
#define ROUND_TRIP(type, v, format, parse)                                                            \
    do {                                                                                              \
        static type back_;                                                                            \
        FUZZ_CHECK(format(&(v), buf, sizeof buf) == 0, "an accepted %s does not format", #type);      \
        err[0] = 0;                                                                                   \
        FUZZ_CHECK(parse(buf, &back_, err, sizeof err) == 0, "a formatted %s is refused: %s (%s)", #type, err, buf); \
        FUZZ_CHECK(memcmp(&(v), &back_, sizeof(v)) == 0, "%s changed in a round trip: %s", #type, buf); \
    } while (0)

static int ms_in_range(double v) { return isfinite(v) && v >= 0 && v < 1e12; }

static void check_int(const char *in) {
    long long v;
    err[0] = 0;
    if (proto_int_parse(in, "value", -5, 1LL << 40, &v, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] && v == 0, "integer refused without a message or with a value");
        return;
    }
    FUZZ_CHECK(v >= -5 && v <= 1LL << 40, "integer %lld out of range", v);
    long long back;
    FUZZ_CHECK(proto_int_format(v, buf, sizeof buf) == 0, "integer does not format");
    FUZZ_CHECK(proto_int_parse(buf, "value", -5, 1LL << 40, &back, err, sizeof err) == 0 && back == v, "integer round trip");
}

static void check_fault(const char *in) {
    static FaultRecord f;
    err[0] = 0;
    if (fault_record_parse(in, &f, err, sizeof err) != 0) { REFUSED(0, f); return; }
    FUZZ_CHECK(f.kind[0] && memchr(f.kind, 0, sizeof f.kind) && f.rank >= 0 && f.rank < DP_MAX_RANKS && f.wall_ms >= 0,
               "fault record out of range");
    ROUND_TRIP(FaultRecord, f, fault_record_format, fault_record_parse);
}

static void check_persist(const char *in) {
    static PersistRequest p;
    err[0] = 0;
    if (persist_request_parse(in, &p, err, sizeof err) != 0) { REFUSED(0, p); return; }
    FUZZ_CHECK(p.epoch >= 0 && p.step >= 0 && p.writer >= -1 && p.writer < DP_MAX_RANKS && p.nfailed >= 0 &&
                   p.nfailed <= DP_MAX_RANKS, "persist request out of range");
    for (int i = 0; i < p.nfailed; i++) {
        FUZZ_CHECK(p.failed[i] >= 0 && p.failed[i] < DP_MAX_RANKS, "failed rank %d", p.failed[i]);
        for (int j = 0; j < i; j++) FUZZ_CHECK(p.failed[j] != p.failed[i], "rank %d twice", p.failed[i]);
    }
    ROUND_TRIP(PersistRequest, p, persist_request_format, persist_request_parse);
}

static void check_timing(const char *in) {
    static JoinTiming t;
    err[0] = 0;
    if (join_timing_parse(in, &t, err, sizeof err) != 0) { REFUSED(0, t); return; }
    FUZZ_CHECK(ms_in_range(t.restore_ms) && ms_in_range(t.rebuild_ms) && ms_in_range(t.resnapshot_ms) &&
                   t.resumed_wall_ms >= 0 && (t.warm == 0 || t.warm == 1), "join timing out of range");
    ROUND_TRIP(JoinTiming, t, join_timing_format, join_timing_parse);
}

static void check_stats(const char *in) {
    static JoinStats s;
    err[0] = 0;
    if (join_stats_parse(in, &s, err, sizeof err) != 0) { REFUSED(0, s); return; }
    FUZZ_CHECK(s.ctl_round_trips >= 0 && s.store_round_trips >= 0 && ms_in_range(s.rendezvous_ms) &&
                   ms_in_range(s.barrier_ms) && ms_in_range(s.wait_ms) && ms_in_range(s.connect_ms) && s.entered_wall_ms >= 0,
               "join stats out of range");
    ROUND_TRIP(JoinStats, s, join_stats_format, join_stats_parse);
}

static void check_exit(const char *in) {
    static ExitRecord e;
    err[0] = 0;
    if (exit_record_parse(in, &e, err, sizeof err) != 0) { REFUSED(0, e); return; }
    FUZZ_CHECK(e.how >= 0 && e.how < EXITED_HOWS && e.wall_ms >= 0, "exit record out of range");
    ROUND_TRIP(ExitRecord, e, exit_record_format, exit_record_parse);
}

static void check_launcher(const char *in) {
    static LauncherId l;
    err[0] = 0;
    if (launcher_id_parse(in, &l, err, sizeof err) != 0) { REFUSED(0, l); return; }
    FUZZ_CHECK(l.pid > 0 && memchr(l.host, 0, sizeof l.host) && !strchr(l.host, ' '), "launcher id out of range");
    ROUND_TRIP(LauncherId, l, launcher_id_format, launcher_id_parse);
}

static void check_lease(const char *in) {
    static LeaseValue l;
    err[0] = 0;
    if (lease_value_parse(in, &l, err, sizeof err) != 0) { REFUSED(0, l); return; }
    FUZZ_CHECK(l.token >= 1 && l.holder[0] && memchr(l.holder, 0, sizeof l.holder) && !strchr(l.holder, ':'), "lease out of range");
    ROUND_TRIP(LeaseValue, l, lease_value_format, lease_value_parse);
}

static void check_endpoint(const char *in) {
    static Endpoint e;
    err[0] = 0;
    if (endpoint_parse(in, &e, err, sizeof err) != 0) { REFUSED(0, e); return; }
    FUZZ_CHECK(e.port >= 1 && e.port <= 65535 && e.host[0] && memchr(e.host, 0, sizeof e.host), "endpoint out of range");
    ROUND_TRIP(Endpoint, e, endpoint_format, endpoint_parse);
}

static void check_held(const char *in) {
    enum { MAX = 64 };
    static HeldGen h[MAX], h2[MAX];
    static const HeldGen zero[MAX];
    err[0] = 0;
    int n = held_parse(in, h, MAX, err, sizeof err);
    if (n < 0) {
        FUZZ_CHECK(err[0] != 0, "held refused without a message");
        FUZZ_CHECK(memcmp(h, zero, sizeof h) == 0, "held refused but left partly filled");
        return;
    }
    FUZZ_CHECK(n <= MAX, "%d entries", n);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(h[i].rank >= 0 && h[i].rank < DP_MAX_RANKS && h[i].step >= -1 && h[i].epoch >= 0, "entry %d", i);
    FUZZ_CHECK(held_format(h, n, buf, sizeof buf) == 0, "an accepted held list does not format");
    memset(h2, 0, sizeof h2);
    FUZZ_CHECK(held_parse(buf, h2, MAX, err, sizeof err) == n, "a formatted held list parses differently: %s", buf);
    FUZZ_CHECK(memcmp(h, h2, sizeof(HeldGen) * (size_t)n) == 0, "held changed in a round trip: %s", buf);
    memset(h, 0, sizeof h);
}

static void check_inventory(const char *in) {
    enum { MAX = 64 };
    static InventoryEntry e[MAX], e2[MAX];
    static char text[INVENTORY_TEXT_MAX];
    err[0] = 0;
    int n = inventory_parse(in, e, MAX, err, sizeof err);
    if (n < 0) {
        FUZZ_CHECK(err[0] != 0, "inventory refused without a message");
        for (int i = 0; i < MAX; i++) FUZZ_CHECK(e[i].step == 0 && e[i].rank == 0, "inventory refused but left partly filled");
        return;
    }
    FUZZ_CHECK(n <= MAX, "%d entries", n);
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(e[i].step >= 0 && e[i].rank >= 0 && e[i].rank < DP_MAX_RANKS, "entry %d out of range", i);
        FUZZ_CHECK(i == 0 || e[i].step < e[i - 1].step || (e[i].step == e[i - 1].step && e[i].rank > e[i - 1].rank),
                   "entry %d out of order", i);
    }
    FUZZ_CHECK(inventory_format(e, n, text, sizeof text) == 0, "an accepted inventory does not format");
    memset(e2, 0, sizeof e2);
    FUZZ_CHECK(inventory_parse(text, e2, MAX, err, sizeof err) == n, "a formatted inventory parses differently: %s", text);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(e2[i].step == e[i].step && e2[i].rank == e[i].rank, "inventory changed in a round trip: %s", text);
    memset(e, 0, sizeof e);
}

static void check_state(const char *in) {
    job_state st;
    err[0] = 0;
    if (job_state_parse(in, &st, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != 0, "state refused without a message");
        return;
    }
    FUZZ_CHECK(st >= 0 && st < JOB_STATES && !strcmp(job_state_name(st), in), "state '%s' is not its own name", in);
}

/* Sealed values: an input is refused unless its tag verifies (then it seals back to itself);
 * the input sealed unseals to itself, and with any one byte changed is refused. */
static void check_seal(const char *in) {
    static const unsigned char key[PROTO_SEAL_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    static char value[PERSIST_REQ_TEXT_MAX], sealed[PERSIST_REQ_TEXT_MAX + PROTO_SEAL_OVERHEAD + 1];
    err[0] = 0;
    if (proto_unseal(key, "job", "field", in, value, sizeof value, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] && !value[0], "a sealed value refused without a message or with a value");
    } else {
        FUZZ_CHECK(proto_seal(key, "job", "field", value, sealed, sizeof sealed) == 0 && !strcmp(sealed, in),
                   "an accepted sealed value does not seal back to itself");
    }
    size_t n = strlen(in);
    if (n >= sizeof value) return;
    FUZZ_CHECK(proto_seal(key, "job", "field", in, sealed, sizeof sealed) == 0, "a value does not seal");
    FUZZ_CHECK(proto_unseal(key, "job", "field", sealed, value, sizeof value, err, sizeof err) == 0 && !strcmp(value, in),
               "a sealed value does not unseal to itself: %s", err);
    FUZZ_CHECK(proto_unseal(key, "job", "other", sealed, value, sizeof value, err, sizeof err) != 0,
               "a value sealed for one field read as another's");
    size_t at = n ? (unsigned char)in[0] % (n + PROTO_SEAL_OVERHEAD) : 0;
    sealed[at] = sealed[at] == 'x' ? 'y' : 'x'; /* never a NUL: the length stays */
    FUZZ_CHECK(proto_unseal(key, "job", "field", sealed, value, sizeof value, err, sizeof err) != 0,
               "a sealed value with byte %zu changed is accepted", at);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *in = malloc(size + 1); /* Redis values arrive NUL-terminated */
    FUZZ_CHECK(in != NULL, "out of memory");
    if (size) memcpy(in, data, size);
    in[size] = 0;
    check_int(in);
    check_fault(in);
    check_persist(in);
    check_timing(in);
    check_stats(in);
    check_exit(in);
    check_launcher(in);
    check_lease(in);
    check_endpoint(in);
    check_held(in);
    check_inventory(in);
    check_state(in);
    check_seal(in);
    free(in);
    return 0;
}
