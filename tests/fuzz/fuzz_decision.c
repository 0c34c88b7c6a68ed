/* fuzz_decision.c — the membership decision's text form (src/control/recovery.c: decision_parse)
 * and the replica-holder list (holders_parse), both read from Redis, from untrusted bytes.
 *
 * A decision that decision_parse accepts must satisfy what its readers rely on (world in
 * range, an owner for every rank, every failed rank inside the world and owned by its
 * spare), must format again (decision_format accepts exactly what decision_parse accepts)
 * and parse back to the same decision. A refusal must say why and leave a zeroed decision.
 * An accepted holder list must round-trip through holders_format the same way, and so must
 * an accepted report (report_parse / report_format, the processes' reports to the
 * coordinator). */
#include "fuzz_util.h"

#include "recovery.h"

static Decision d, d2;
static char text[DECISION_TEXT_MAX];

static void check_decision(const char *in) {
    char err[512] = "";
    if (decision_parse(in, &d, err, sizeof err) != 0) {
        static const Decision zero;
        FUZZ_CHECK(err[0] != 0, "refused without a message");
        FUZZ_CHECK(memcmp(&d, &zero, sizeof d) == 0, "refused but left a partial decision");
        return;
    }
    FUZZ_CHECK(d.world >= 1 && d.world <= RECOVERY_MAX_RANKS, "world %d", d.world);
    FUZZ_CHECK(d.nfailed >= 0 && d.nfailed <= d.world, "nfailed %d of world %d", d.nfailed, d.world);
    FUZZ_CHECK(d.epoch >= 0 && d.rollback >= -1, "epoch %ld rollback %lld", d.epoch, d.rollback);
    for (int r = 0; r < d.world; r++) FUZZ_CHECK(d.procs[r] > 0, "rank %d has owner %ld", r, d.procs[r]);
    for (int r = d.world; r < RECOVERY_MAX_RANKS; r++) FUZZ_CHECK(d.procs[r] == 0, "rank %d beyond the world", r);
    for (int i = 0; i < d.nfailed; i++) {
        const FailedRank *f = &d.failed[i];
        FUZZ_CHECK(f->rank >= 0 && f->rank < d.world && f->spare_proc == d.procs[f->rank] && f->old_proc > 0,
                   "failed entry %d: rank %d old %ld spare %ld", i, f->rank, f->old_proc, f->spare_proc);
        FUZZ_CHECK(f->kind[0] && memchr(f->kind, 0, sizeof f->kind), "failed entry %d: kind", i);
        FUZZ_CHECK(decision_rank_replaced(&d, f->rank), "rank %d not replaced", f->rank);
    }
    FUZZ_CHECK(decision_format(&d, text, sizeof text) == 0, "an accepted decision does not format");
    FUZZ_CHECK(decision_parse(text, &d2, err, sizeof err) == 0, "a formatted decision is refused: %s\n%s", err, text);
    FUZZ_CHECK(memcmp(&d, &d2, sizeof d) == 0, "decision changed in a round trip:\n%s", text);
}

static void check_holders(const char *in) {
    Holder h[HOLDERS_MAX], h2[HOLDERS_MAX];
    memset(h, 0, sizeof h);
    memset(h2, 0, sizeof h2);
    int n = holders_parse(in, h, HOLDERS_MAX);
    if (n < 0) return;
    FUZZ_CHECK(n <= HOLDERS_MAX, "%d holders", n);
    char list[HOLDERS_TEXT_MAX];
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(h[i].proc > 0 && h[i].port > 0 && h[i].port <= 65535 && h[i].host[0], "holder %d", i);
        FUZZ_CHECK(memchr(h[i].host, 0, sizeof h[i].host) != NULL, "holder %d: host not terminated", i);
    }
    if (holders_format(h, n, list, sizeof list) != 0) return; /* longer than one record holds */
    FUZZ_CHECK(holders_parse(list, h2, HOLDERS_MAX) == n, "a formatted list parses differently: %s", list);
    FUZZ_CHECK(memcmp(h, h2, sizeof h) == 0, "holders changed in a round trip: %s", list);
}

static void check_report(const char *in, size_t n) {
    static Report r, r2;
    static char buf[REPORT_TEXT_MAX];
    char err[256] = "";
    if (report_parse(in, n, &r, err, sizeof err) != 0) {
        static const Report zero;
        FUZZ_CHECK(err[0] != 0, "report refused without a message");
        FUZZ_CHECK(memcmp(&r, &zero, sizeof r) == 0, "report refused but left partly filled");
        return;
    }
    FUZZ_CHECK(r.kind >= 0 && r.kind < REPORT_KINDS && r.phase >= 0 && r.phase < JOIN_PHASES, "kind %d phase %d", r.kind, r.phase);
    FUZZ_CHECK(r.rank >= -1 && r.rank < RECOVERY_MAX_RANKS && r.epoch >= -1 && r.step >= -1, "rank %d epoch %ld", r.rank, r.epoch);
    FUZZ_CHECK(memchr(r.text, 0, sizeof r.text) != NULL, "text not terminated");
    FUZZ_CHECK(report_format(&r, buf, sizeof buf) == 0, "an accepted report does not format");
    FUZZ_CHECK(report_parse(buf, strlen(buf), &r2, err, sizeof err) == 0, "a formatted report is refused: %s", err);
    FUZZ_CHECK(memcmp(&r, &r2, sizeof r) == 0, "report changed in a round trip");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *in = malloc(size + 1); /* Redis values arrive NUL-terminated */
    FUZZ_CHECK(in != NULL, "out of memory");
    if (size) memcpy(in, data, size);
    in[size] = 0;
    check_decision(in);
    check_holders(in);
    check_report((const char *)data, size);
    free(in);
    return 0;
}
