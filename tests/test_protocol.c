/* test_protocol.c — the control plane's protocol (issue 28, item 1): every key's name as the
 * table spells it (the names Redis holds must not change), and every value's format/parse
 * pair of protocol.h: a round trip of what the writers write, and the refusals, each with an
 * error naming the field and what was found. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "control.h"
#include "harness.h"
#include "protocol.h"

static char buf[PERSIST_REQ_TEXT_MAX], err[512];

/* The key names as they were spelled by hand before the table (control.c, runtime.c, ...):
 * a job's keys in a running Redis keep their names across this change. */
static void test_key_names_unchanged(void) {
    static const struct {
        ctl_key k;
        long long a, b;
        const char *want;
    } cases[] = {
        {KEY_CONFIG, 0, 0, "config"},         {KEY_PROCS, 0, 0, "procs"},
        {KEY_RANK, 7, 0, "rank:7"},           {KEY_SPARES, 0, 0, "spares"},
        {KEY_PROC, 12, 0, "proc:12"},         {KEY_COMMITTED, 3, 5, "e3:committed:5"},
        {KEY_EPOCH, 0, 0, "epoch"},           {KEY_NOTICE, 9, 0, "notice:9"},
        {KEY_ABORT, 9, 0, "abort:9"},         {KEY_HB, 9, 0, "hb:9"},
        {KEY_STATE, 0, 0, "state"},           {KEY_EVENTS, 0, 0, "events"},
        {KEY_METRICS, 0, 0, "metrics"},       {KEY_REPORTS, 0, 0, "reports"},
        {KEY_DECISION, 4, 0, "decision:4"},   {KEY_HOLDERS, 4, 2, "e4:holders:2"},
        {KEY_FENCED, 4, 0, "e4:fenced"},      {KEY_GLOO, 4, 0, "e4:gloo"},
        {KEY_APP, 4, 0, "e4:app:"},           {KEY_TIMING, 4, 1, "e4:timing:1"},
        {KEY_INJECTED, 2, 0, "injected:2:0"}, {KEY_CHAOS, 30, 0, "chaos:30"},
        {KEY_FAULT_LAST, 1, 0, "fault:last:1"}, {KEY_LAST_STEP, 0, 0, "last_step"},
        {KEY_PERSIST_REQ, 0, 0, "persist:req"}, {KEY_PERSISTED, 8, 0, "persisted:8"},
        {KEY_JOIN_STATS, 4, 1, "e4:join:1"},  {KEY_LAUNCHER, 0, 0, "launcher"},
        {KEY_LAUNCHER_SEEN, 0, 0, "launcher:seen"}, {KEY_NODES, 0, 0, "nodes"},
        {KEY_NODE_COUNT, 0, 0, "nodes:n"},    {KEY_NODE_ALIVE, 3, 0, "node:3:alive"},
        {KEY_EXIT, 77, 0, "exit:77"},         {KEY_PROGRESS, 0, 0, "metrics:last"},
        {KEY_COORD, 0, 0, "coordinator"},     {KEY_COORD_TOKEN, 0, 0, "coordinator:token"},
        {KEY_PERSIST_COMPLETE, 0, 0, "persist:complete"}, {KEY_INVENTORY, 0, 0, "inventory"},
        {KEY_RESUME_HOLDER, 6, 0, "resume:holder:6"}, {KEY_STATELESS, 6, 0, "stateless:6"},
        {KEY_GEN_BYTES, 6, 0, "gen_bytes:6"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECK(n == KEY_COUNT, "%d keys tested, %d in the table", n, KEY_COUNT);
    for (int i = 0; i < n; i++) {
        char s[128];
        ctl_key_suffix(s, sizeof s, cases[i].k, cases[i].a, cases[i].b);
        CHECK(!strcmp(s, cases[i].want), "key %d: '%s', expected '%s'", (int)cases[i].k, s, cases[i].want);
    }
    char s[8];
    ctl_key_suffix(s, sizeof s, KEY_COMMITTED, 123456, 7); /* truncated, never overrun */
    CHECK(strlen(s) == 7 && !strncmp(s, "e123456", 7), "truncated key '%s'", s);
}

/* The hashes' field names as they were spelled at the call sites before the enums. */
static void test_field_names_unchanged(void) {
    static const char *const config[CFG_FIELDS] = {[CFG_CONFIG] = "config", [CFG_T0_MS] = "t0_ms"};
    static const char *const proc[PROC_FIELDS] = {[PROC_REPLICA] = "replica", [PROC_HOST] = "host", [PROC_NODE] = "node",
                                                  [PROC_PID] = "pid", [PROC_HELD] = "held"};
    for (int f = 0; f < CFG_FIELDS; f++)
        CHECK(config[f] && !strcmp(ctl_config_field_name((ctl_config_field)f), config[f]), "config field %d: '%s'", f,
              ctl_config_field_name((ctl_config_field)f));
    for (int f = 0; f < PROC_FIELDS; f++)
        CHECK(proc[f] && !strcmp(ctl_proc_field_name((ctl_proc_field)f), proc[f]), "process field %d: '%s'", f,
              ctl_proc_field_name((ctl_proc_field)f));
    CHECK(!strcmp(ctl_config_field_name(CFG_FIELDS), "?") && !strcmp(ctl_proc_field_name((ctl_proc_field)-1), "?"),
          "a field outside the enum has a name");
}

static void test_integers(void) {
    long long v;
    CHECK(proto_int_format(-42, buf, sizeof buf) == 0 && !strcmp(buf, "-42"), "format: '%s'", buf);
    CHECK(proto_int_parse("1764590000125", "t0_ms", 0, LLONG_MAX, &v, err, sizeof err) == 0 && v == 1764590000125LL, "parse");
    const char *bad[] = {"", "-", "+1", " 1", "1 ", "1x", "0x10", "99999999999999999999", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(proto_int_parse(bad[i], "last_step", 0, LLONG_MAX, &v, err, sizeof err) == -1 && v == 0, "'%s' accepted", bad[i]);
        CHECK(strstr(err, "last_step") && strstr(err, "expected an integer"), "error '%s'", err);
    }
    CHECK(proto_int_parse("-2", "epoch", -1, 10, &v, err, sizeof err) == -1 && strstr(err, "[-1, 10]") && strstr(err, "'-2'"),
          "range: %s", err);
    CHECK(proto_int_format(5, buf, 1) == -1, "a 1-byte buffer holds no number");
}

static void test_fault_record(void) {
    FaultRecord f = {.kind = "kill", .rank = 3, .wall_ms = 1764590000125}, g;
    CHECK(fault_record_format(&f, buf, sizeof buf) == 0 && !strcmp(buf, "kill:3:1764590000125"), "format: '%s'", buf);
    CHECK(fault_record_parse(buf, &g, err, sizeof err) == 0 && !memcmp(&f, &g, sizeof f), "round trip: %s", err);
    static const struct { const char *in, *field; } bad[] = {
        {"kill:3", "3 fields"}, {"kill:3:1:2", "3 fields"}, {"Kill:3:1", "kind"}, {":3:1", "kind"},
        {"kill:-1:1", "rank"}, {"kill:1024:1", "rank"}, {"kill:3:-5", "wall_ms"}, {"kill:3:", "wall_ms"},
        {"averyveryverylongkind:3:1", "kind"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        memset(&g, 0x5a, sizeof g);
        static const FaultRecord zero;
        CHECK(fault_record_parse(bad[i].in, &g, err, sizeof err) == -1 && !memcmp(&g, &zero, sizeof g), "'%s' accepted", bad[i].in);
        CHECK(strstr(err, "fault record") && strstr(err, bad[i].field), "'%s': error '%s' does not name %s", bad[i].in, err,
              bad[i].field);
    }
    f.rank = -1;
    CHECK(fault_record_format(&f, buf, sizeof buf) == -1, "a negative rank formats");
    f = (FaultRecord){.kind = "no:colons", .rank = 1};
    CHECK(fault_record_format(&f, buf, sizeof buf) == -1, "a kind with ':' formats");
}

static void test_persist_request(void) {
    static PersistRequest p, q;
    memset(&p, 0, sizeof p);
    p.epoch = 2;
    p.step = 17;
    p.writer = 0;
    p.nfailed = 2;
    p.failed[0] = 3;
    p.failed[1] = 1;
    CHECK(persist_request_format(&p, buf, sizeof buf) == 0 && !strcmp(buf, "2:17:0:3,1"), "format: '%s'", buf);
    CHECK(persist_request_parse(buf, &q, err, sizeof err) == 0 && !memcmp(&p, &q, sizeof p), "round trip: %s", err);
    CHECK(persist_request_parse("0:0:-1:", &q, err, sizeof err) == 0 && q.writer == -1 && q.nfailed == 0, "no writer, no rank");
    static const struct { const char *in, *field; } bad[] = {
        {"2:17:0", "4 fields"}, {"2:17:0:1:2", "4 fields"}, {"-1:17:0:1", "epoch"}, {"2:-1:0:1", "step"},
        {"2:17:-2:1", "writer"}, {"2:17:0:1,,2", "failed rank 2"}, {"2:17:0:1,", "failed rank 2"},
        {"2:17:0:1,1", "twice"}, {"2:17:0:x", "failed rank 1"}, {"2:17:0:1024", "failed rank 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(persist_request_parse(bad[i].in, &q, err, sizeof err) == -1 && q.nfailed == 0 && q.epoch == 0, "'%s' accepted",
              bad[i].in);
        CHECK(strstr(err, "persist request") && strstr(err, bad[i].field), "'%s': error '%s' does not name %s", bad[i].in, err,
              bad[i].field);
    }
    p.failed[1] = 3;
    CHECK(persist_request_format(&p, buf, sizeof buf) == -1, "a rank listed twice formats");
    p.failed[1] = 1;
    CHECK(persist_request_format(&p, buf, 8) == -1, "a short buffer holds the request");
}

static void test_join_timing_and_stats(void) {
    JoinTiming t = {.restore_ms = 12.25, .rebuild_ms = 3, .resnapshot_ms = 0.125, .resumed_wall_ms = 1764590000125, .warm = 1}, u;
    CHECK(join_timing_format(&t, buf, sizeof buf) == 0 && !strcmp(buf, "12.250 3.000 0.125 1764590000125 1"), "format: '%s'", buf);
    CHECK(join_timing_parse(buf, &u, err, sizeof err) == 0 && !memcmp(&t, &u, sizeof t), "round trip: %s", err);
    static const struct { const char *in, *field; } tbad[] = {
        {"1 2 3 4", "5 fields"}, {"1 2 3 4 1 ", "5 fields"}, {"1 x 3 4 1", "rebuild_ms"}, {"-1 2 3 4 1", "restore_ms"},
        {"1 2 3.1234 4 1", "resnapshot_ms"}, {"1 2 nan 4 1", "resnapshot_ms"}, {"1 2 3 -4 1", "resumed_wall_ms"},
        {"1 2 3 4 2", "warm"}, {"1e3 2 3 4 1", "restore_ms"}, {"1. 2 3 4 1", "restore_ms"},
    };
    for (size_t i = 0; i < sizeof tbad / sizeof tbad[0]; i++) {
        err[0] = 0;
        CHECK(join_timing_parse(tbad[i].in, &u, err, sizeof err) == -1 && u.restore_ms == 0 && u.warm == 0, "'%s' accepted", tbad[i].in);
        CHECK(strstr(err, "join timing") && strstr(err, tbad[i].field), "'%s': error '%s' does not name %s", tbad[i].in, err,
              tbad[i].field);
    }
    t.restore_ms = -0.5;
    CHECK(join_timing_format(&t, buf, sizeof buf) == -1, "a negative duration formats");
    t.restore_ms = 999999999999.9999; /* rounds to 13 digits: refused, not written unreadable */
    CHECK(join_timing_format(&t, buf, sizeof buf) == -1, "a duration of 10^12 ms formats: %s", buf);

    JoinStats s = {.ctl_round_trips = 4, .store_round_trips = 3, .rendezvous_ms = 20.5, .barrier_ms = 1.25, .wait_ms = 10,
                   .connect_ms = 2.5, .entered_wall_ms = 1764590000100, .dialed = 1, .accepted = 15}, r;
    CHECK(join_stats_format(&s, buf, sizeof buf) == 0 && !strcmp(buf, "4 3 20.500 1.250 10.000 2.500 1764590000100 1 15"),
          "format: '%s'", buf);
    CHECK(join_stats_parse(buf, &r, err, sizeof err) == 0 && !memcmp(&s, &r, sizeof s), "round trip: %s", err);
    static const struct { const char *in, *field; } sbad[] = {
        {"4 3 20 1 10 2 5", "9 fields"}, {"-4 3 20 1 10 2 5 0 0", "ctl_round_trips"},
        {"4 x 20 1 10 2 5 0 0", "store_round_trips"}, {"4 3 20 1 10 inf 5 0 0", "connect_ms"},
        {"4 3 20 1 10 2 -5 0 0", "entered_wall_ms"}, {"4 3 20 1 10 2 5 -1 0", "dialed"},
        {"4 3 20 1 10 2 5 0 2147483648", "accepted"},
    };
    for (size_t i = 0; i < sizeof sbad / sizeof sbad[0]; i++) {
        err[0] = 0;
        CHECK(join_stats_parse(sbad[i].in, &r, err, sizeof err) == -1 && r.ctl_round_trips == 0 && r.rendezvous_ms == 0,
              "'%s' accepted", sbad[i].in);
        CHECK(strstr(err, "join stats") && strstr(err, sbad[i].field), "'%s': error '%s' does not name %s", sbad[i].in, err,
              sbad[i].field);
    }
}

static void test_exit_record(void) {
    ExitRecord e = {.how = EXITED_BAD_JOB, .wall_ms = 99}, f;
    CHECK(exit_record_format(&e, buf, sizeof buf) == 0 && !strcmp(buf, "bad_job:99"), "format: '%s'", buf);
    CHECK(exit_record_parse(buf, &f, err, sizeof err) == 0 && f.how == EXITED_BAD_JOB && f.wall_ms == 99, "round trip");
    CHECK(exit_record_parse("departed:1", &f, err, sizeof err) == 0 && f.how == EXITED_DEPARTED, "departed");
    CHECK(exit_record_parse("crash:1", &f, err, sizeof err) == 0 && f.how == EXITED_CRASH, "crash");
    static const struct { const char *in, *field; } bad[] = {
        {"crash", "2 fields"}, {"departedx:1", "how"}, {"crash:1:2", "2 fields"}, {"crash:x", "wall_ms"}, {"", "2 fields"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(exit_record_parse(bad[i].in, &f, err, sizeof err) == -1 && f.how == 0 && f.wall_ms == 0, "'%s' accepted", bad[i].in);
        CHECK(strstr(err, "exit record") && strstr(err, bad[i].field), "'%s': error '%s' does not name %s", bad[i].in, err,
              bad[i].field);
    }
    e.how = EXITED_HOWS;
    CHECK(exit_record_format(&e, buf, sizeof buf) == -1, "an unknown how formats");
}

static void test_launcher_lease_endpoint(void) {
    LauncherId l = {.host = "node-1.example", .pid = 4242}, m;
    CHECK(launcher_id_format(&l, buf, sizeof buf) == 0 && !strcmp(buf, "node-1.example 4242"), "format: '%s'", buf);
    CHECK(launcher_id_parse(buf, &m, err, sizeof err) == 0 && !memcmp(&l, &m, sizeof l), "round trip: %s", err);
    CHECK(launcher_id_parse("a b 1", &m, err, sizeof err) == -1 && strstr(err, "2 fields"), "3 fields: %s", err);
    CHECK(launcher_id_parse("host 0", &m, err, sizeof err) == -1 && strstr(err, "pid"), "pid 0: %s", err);
    CHECK(launcher_id_parse("ho\tst 5", &m, err, sizeof err) == -1 && strstr(err, "host"), "a tab: %s", err);

    LeaseValue v = {.holder = "machine3", .token = 12}, w;
    CHECK(lease_value_format(&v, buf, sizeof buf) == 0 && !strcmp(buf, "machine3:12"), "format: '%s'", buf);
    CHECK(lease_value_parse(buf, &w, err, sizeof err) == 0 && !memcmp(&v, &w, sizeof v), "round trip: %s", err);
    CHECK(lease_value_parse("machine3:0", &w, err, sizeof err) == -1 && strstr(err, "token"), "token 0: %s", err);
    CHECK(lease_value_parse("a:b:1", &w, err, sizeof err) == -1 && strstr(err, "2 fields"), "a:b:1: %s", err);
    CHECK(lease_value_parse(":1", &w, err, sizeof err) == -1 && strstr(err, "holder"), "no holder: %s", err);
    snprintf(v.holder, sizeof v.holder, "has space");
    CHECK(lease_value_format(&v, buf, sizeof buf) == -1, "a holder with a space formats");

    Endpoint e = {.host = "::1", .port = 4000}, f;
    CHECK(endpoint_format(&e, buf, sizeof buf) == 0 && !strcmp(buf, "::1:4000"), "format: '%s'", buf);
    CHECK(endpoint_parse(buf, &f, err, sizeof err) == 0 && !memcmp(&e, &f, sizeof e), "round trip (IPv6): %s", err);
    static const struct { const char *in, *field; } bad[] = {
        {"host", "no ':'"}, {":80", "host"}, {"h:0", "port"}, {"h:65536", "port"}, {"h:80x", "port"}, {"h\n:80", "host"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(endpoint_parse(bad[i].in, &f, err, sizeof err) == -1 && f.port == 0 && !f.host[0], "'%s' accepted", bad[i].in);
        CHECK(strstr(err, "endpoint") && strstr(err, bad[i].field), "'%s': error '%s' does not name %s", bad[i].in, err,
              bad[i].field);
    }
}

static void test_held_and_state(void) {
    HeldGen h[3], g[3];
    memset(h, 0, sizeof h); /* the padding too: compared whole below */
    memset(g, 0, sizeof g);
    h[0] = (HeldGen){0, 17, 2};
    h[1] = (HeldGen){3, -1, 2};
    h[2] = (HeldGen){1, 5, 1};
    CHECK(held_format(h, 3, buf, sizeof buf) == 0 && !strcmp(buf, "0:17:2,3:-1:2,1:5:1"), "format: '%s'", buf);
    CHECK(held_parse(buf, g, 3, err, sizeof err) == 3, "round trip: %s", err);
    for (int i = 0; i < 3; i++)
        CHECK(g[i].rank == h[i].rank && g[i].step == h[i].step && g[i].epoch == h[i].epoch, "entry %d changed", i);
    CHECK(held_format(h, 0, buf, sizeof buf) == 0 && !buf[0] && held_parse("", g, 3, err, sizeof err) == 0, "empty list");
    CHECK(held_parse(buf, g, 3, err, sizeof err) == 0, "empty");
    CHECK(held_parse("0:1:2,1:1:1,2:1:1,3:1:1", g, 3, err, sizeof err) == -1 && strstr(err, "more than 3"), "too many: %s", err);
    CHECK(held_parse("0:1:2,", g, 3, err, sizeof err) == -1 && strstr(err, "entry 2"), "trailing comma: %s", err);
    CHECK(held_parse("0:1", g, 3, err, sizeof err) == -1 && strstr(err, "entry 1") && strstr(err, "RANK:STEP:EPOCH"), "2 fields: %s", err);
    CHECK(held_parse("0:1:2,x:1:1", g, 3, err, sizeof err) == -1 && strstr(err, "entry 2") && g[0].step == 0, "bad rank: %s", err);
    h[1].rank = -1;
    CHECK(held_format(h, 3, buf, sizeof buf) == -1, "a negative rank formats");

    job_state st;
    for (int s = 0; s < JOB_STATES; s++)
        CHECK(job_state_parse(job_state_name((job_state)s), &st, err, sizeof err) == 0 && st == (job_state)s, "state %d", s);
    CHECK(!strcmp(job_state_name(JOB_STATE_STOPPING), "stopping"), "stopping");
    CHECK(job_state_parse("Running", &st, err, sizeof err) == -1 && strstr(err, "job state") && strstr(err, "'Running'"),
          "error: %s", err);
}

/* KEY_INVENTORY's values: what checkpoint_inventory writes round-trips; every departure from
 * the grammar (order, ranges, empty parts, too many entries) is refused with the group named. */
static void test_inventory(void) {
    InventoryEntry e[8], back[8];
    static const InventoryEntry w[] = {{149, 0}, {149, 1}, {149, 3}, {99, 2}, {0, 1023}};
    CHECK(inventory_format(w, 5, buf, sizeof buf) == 0 && !strcmp(buf, "149:0,1,3;99:2;0:1023"), "format: '%s'", buf);
    int same = inventory_parse(buf, back, 8, err, sizeof err) == 5;
    for (int i = 0; same && i < 5; i++) same = back[i].step == w[i].step && back[i].rank == w[i].rank;
    CHECK(same, "round trip: %s", err);
    CHECK(inventory_format(w, 0, buf, sizeof buf) == 0 && !buf[0] && inventory_parse("", e, 8, err, sizeof err) == 0,
          "no checkpoint: '%s'", buf);
    static const struct {
        const char *in, *want;
    } bad[] = {
        {"99:1;149:0", "group 2: expected a step below 99 (newest first), found 149"},
        {"99:1;99:2", "group 2: expected a step below 99"},
        {"99:1,0", "group 1 (step 99): expected a rank above 1 (ascending), found 0"},
        {"99:1,1", "expected a rank above 1"},
        {"99:", "group 1 (step 99): expected a rank in [0, 1024), found ''"},
        {"99:1,", "found ''"},
        {"99:1;", "group 2 is empty"},
        {";99:1", "group 1: expected STEP:R,R,..."},
        {"x:1", "group 1: expected STEP:R,R,... (step >= 0), found 'x:1'"},
        {"-1:0", "group 1: expected STEP:R,R,..."},
        {"99:1024", "expected a rank in [0, 1024), found '1024'"},
        {"99:+1", "found '+1'"},
        {"99 :1", "group 1: expected STEP"},
        {"99:1,2,3,4,5,6,7,8,9", "more than 8 entries"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(e, 0xff, sizeof e);
        err[0] = 0;
        int rc = inventory_parse(bad[i].in, e, 8, err, sizeof err);
        int zeroed = 1;
        for (int j = 0; j < 8; j++) zeroed &= e[j].step == 0 && e[j].rank == 0;
        CHECK(rc == -1 && strstr(err, "inventory: ") && strstr(err, bad[i].want) && zeroed,
              "'%s': %d, %s", bad[i].in, rc, err);
    }
    static const InventoryEntry unordered[] = {{99, 1}, {149, 0}}, dup[] = {{99, 1}, {99, 1}}, neg[] = {{99, -1}},
                                 negstep[] = {{-1, 0}};
    CHECK(inventory_format(unordered, 2, buf, sizeof buf) == -1 && inventory_format(dup, 2, buf, sizeof buf) == -1 &&
              inventory_format(neg, 1, buf, sizeof buf) == -1 && inventory_format(negstep, 1, buf, sizeof buf) == -1,
          "entries the parser refuses format");
    char tiny[6];
    CHECK(inventory_format(w, 5, tiny, sizeof tiny) == -1, "a buffer too small");
}

/* The collective rendezvous's keys under KEY_GLOO's prefix (comm_gloo.cc's, the coordinator's
 * wake-up pushes): the names Redis holds, a key that does not fit refused. */
static void test_rendezvous_keys(void) {
    char k[64];
    CHECK(proto_rdzv_key(k, sizeof k, "dp:j:e3:gloo", PROTO_RDZV_MEMBER, 5) == 0 && !strcmp(k, "dp:j:e3:gloo/m/5"), "member '%s'", k);
    CHECK(proto_rdzv_key(k, sizeof k, "dp:j:e3:gloo", PROTO_RDZV_ARRIVALS, 5) == 0 && !strcmp(k, "dp:j:e3:gloo/n"), "arrivals '%s'", k);
    CHECK(proto_rdzv_key(k, sizeof k, "dp:j:e3:gloo", PROTO_RDZV_WAKE, 12) == 0 && !strcmp(k, "dp:j:e3:gloo/w/12"), "wake '%s'", k);
    CHECK(proto_rdzv_key(k, 10, "dp:j:e3:gloo", PROTO_RDZV_WAKE, 12) == -1 && !k[0], "a key that does not fit: '%s'", k);
    CHECK(proto_rdzv_key(k, sizeof k, "p", (proto_rdzv)7, 1) == -1 && !k[0], "no such key: '%s'", k);
}

int main(void) {
    RUN_TEST(test_key_names_unchanged);
    RUN_TEST(test_field_names_unchanged);
    RUN_TEST(test_integers);
    RUN_TEST(test_fault_record);
    RUN_TEST(test_persist_request);
    RUN_TEST(test_join_timing_and_stats);
    RUN_TEST(test_exit_record);
    RUN_TEST(test_launcher_lease_endpoint);
    RUN_TEST(test_held_and_state);
    RUN_TEST(test_inventory);
    RUN_TEST(test_rendezvous_keys);
    TEST_MAIN_END();
}
