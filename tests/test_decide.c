/* test_decide.c — the coordinator's decision (decide.h), a pure function, in each of its
 * cases, and the decision's text form (recovery.h: decision_format / decision_parse), which
 * must refuse anything that is not a whole, consistent decision. */
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "config.h"
#include "decide.h"
#include "harness.h"
#include "recovery.h"

/* Large (a few hundred KB): kept off the stack. */
static DecideInput g_in;
static Decision g_d, g_d2;
static char g_why[2048];
static char g_text[DECISION_TEXT_MAX];

/* A world of 4 members (procs 11..14) in epoch 2 that started from step 5 and committed up
 * to 9; no failure, no spare. */
static DecideInput *base_input(void) {
    memset(&g_in, 0, sizeof g_in);
    g_in.ft = FT_DEADPOOL;
    g_in.epoch = 2;
    g_in.world = 4;
    for (int r = 0; r < 4; r++) g_in.procs[r] = 11 + r;
    g_in.restore_point = 5;
    g_in.committed_min = 9;
    g_in.now_wall_ms = 50000;
    g_in.checkpoint_step = -1;
    g_in.resume = "deadpool run --resume /data/run1 -- ./train --lr 0.1";
    g_in.spare_wait = 30;
    return &g_in;
}

/* Adds a failure of `rank`, its replicas held by the given procs (each alive per `alive`). */
static DecideFailure *add_failure(DecideInput *in, int rank, const char *kind, int64_t t_fail, int64_t t_detect,
                                  int nholders, const long *holders, const int *alive) {
    DecideFailure *f = &in->failed[in->nfailed++];
    f->rank = rank;
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    f->t_fail_ms = t_fail;
    f->t_detect_ms = t_detect;
    f->nholders = nholders;
    f->stateless_through = -1;
    for (int h = 0; h < nholders; h++) {
        f->holder_proc[h] = holders[h];
        f->holder_alive[h] = alive[h];
    }
    return f;
}

static void add_spares(DecideInput *in, int n, const long *spares) {
    for (int i = 0; i < n; i++) in->spares[in->nspares++] = spares[i];
}

static decide_outcome run(const DecideInput *in) {
    memset(&g_d, 0xAB, sizeof g_d); /* decide_next must not rely on a zeroed output */
    memset(g_why, 'x', sizeof g_why);
    g_why[sizeof g_why - 1] = 0;
    return decide_next(in, &g_d, g_why, sizeof g_why);
}

/* The decision survives the trip through Redis's text, as runtime.c reads it. */
static void check_roundtrip(const Decision *d) {
    char err[256] = "";
    CHECK(decision_format(d, g_text, sizeof g_text) == 0, "format");
    CHECK(decision_parse(g_text, &g_d2, err, sizeof err) == 0, "%s\n%s", err, g_text);
    CHECK(g_d2.epoch == d->epoch && g_d2.world == d->world && g_d2.rollback == d->rollback && g_d2.nfailed == d->nfailed &&
              g_d2.t_fail_ms == d->t_fail_ms && g_d2.t_detect_ms == d->t_detect_ms && g_d2.t_decide_ms == d->t_decide_ms,
          "header differs after the round trip");
    for (int r = 0; r < d->world; r++) CHECK(g_d2.procs[r] == d->procs[r], "rank %d", r);
    for (int i = 0; i < d->nfailed; i++)
        CHECK(g_d2.failed[i].rank == d->failed[i].rank && g_d2.failed[i].old_proc == d->failed[i].old_proc &&
                  g_d2.failed[i].spare_proc == d->failed[i].spare_proc && !strcmp(g_d2.failed[i].kind, d->failed[i].kind),
              "failed entry %d", i);
}

static void test_one_failure(void) {
    DecideInput *in = base_input();
    long holders[] = {14}, spares[] = {20};
    int alive[] = {1};
    add_failure(in, 2, "crash", 1000, 1005, 1, holders, alive);
    add_spares(in, 1, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_SWAP, "outcome %s (%s)", decide_outcome_name(o), g_why);
    CHECK(g_why[0] == 0, "no message for a swap: '%s'", g_why);
    CHECK(g_d.epoch == 3 && g_d.world == 4, "epoch %ld world %d", g_d.epoch, g_d.world);
    CHECK(g_d.rollback == 9, "rollback = min committed: %lld", g_d.rollback);
    CHECK(g_d.procs[0] == 11 && g_d.procs[1] == 12 && g_d.procs[2] == 20 && g_d.procs[3] == 14, "members %ld %ld %ld %ld",
          g_d.procs[0], g_d.procs[1], g_d.procs[2], g_d.procs[3]);
    CHECK(g_d.nfailed == 1 && g_d.failed[0].rank == 2 && g_d.failed[0].old_proc == 13 && g_d.failed[0].spare_proc == 20 &&
              !strcmp(g_d.failed[0].kind, "crash"),
          "failed entry");
    CHECK(g_d.t_fail_ms == 1000 && g_d.t_detect_ms == 1005 && g_d.t_decide_ms == 50000, "times %lld %lld %lld",
          (long long)g_d.t_fail_ms, (long long)g_d.t_detect_ms, (long long)g_d.t_decide_ms);
    CHECK(decision_rank_of(&g_d, 20) == 2 && decision_rank_of(&g_d, 13) == -1, "the spare has rank 2, the old proc none");
    CHECK(decision_rank_replaced(&g_d, 2) && !decision_rank_replaced(&g_d, 1), "replaced");
    check_roundtrip(&g_d);
}

static void test_two_failures_one_epoch(void) {
    DecideInput *in = base_input();
    long h3[] = {11}, h1[] = {13}, spares[] = {40, 31, 25}; /* not in order: decide takes the lowest first */
    int alive[] = {1};
    add_failure(in, 3, "hang", 2000, 4000, 1, h3, alive);
    add_failure(in, 1, "crash", 1500, 4003, 1, h1, alive);
    add_spares(in, 3, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_SWAP, "outcome %s (%s)", decide_outcome_name(o), g_why);
    CHECK(g_d.nfailed == 2, "nfailed %d", g_d.nfailed);
    CHECK(g_d.failed[0].rank == 3 && g_d.failed[0].spare_proc == 25 && g_d.failed[0].old_proc == 14 &&
              !strcmp(g_d.failed[0].kind, "hang"),
          "first failure takes the lowest spare: rank %d <- %ld", g_d.failed[0].rank, g_d.failed[0].spare_proc);
    CHECK(g_d.failed[1].rank == 1 && g_d.failed[1].spare_proc == 31 && g_d.failed[1].old_proc == 12 &&
              !strcmp(g_d.failed[1].kind, "crash"),
          "second failure takes the next: rank %d <- %ld", g_d.failed[1].rank, g_d.failed[1].spare_proc);
    CHECK(g_d.procs[0] == 11 && g_d.procs[1] == 31 && g_d.procs[2] == 13 && g_d.procs[3] == 25, "members");
    CHECK(g_d.t_fail_ms == 1500, "earliest failure time: %lld", (long long)g_d.t_fail_ms);
    CHECK(g_d.t_detect_ms == 4000, "first failure's detection time: %lld", (long long)g_d.t_detect_ms);
    CHECK(g_d.epoch == 3 && g_d.rollback == 9, "one epoch for both");
    check_roundtrip(&g_d);
}

/* A member dies while the job recovers into epoch 3 from step 7: epoch 3 has no commits yet,
 * so the rollback stays the epoch's restore point. */
static void test_failure_during_recovery(void) {
    DecideInput *in = base_input();
    in->epoch = 3;
    in->restore_point = 7;
    in->committed_min = -1;
    long holders[] = {12}, spares[] = {21};
    int alive[] = {1};
    add_failure(in, 0, "crash", 100, 101, 1, holders, alive);
    add_spares(in, 1, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_SWAP, "outcome %s (%s)", decide_outcome_name(o), g_why);
    CHECK(g_d.rollback == 7, "rollback must stay the restore point, got %lld", g_d.rollback);
    CHECK(g_d.epoch == 4 && g_d.procs[0] == 21, "epoch %ld, rank 0 -> %ld", g_d.epoch, g_d.procs[0]);
    /* An error reading the committed generations (-2) changes nothing either. */
    in->committed_min = -2;
    o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.rollback == 7, "rollback %lld", g_d.rollback);
    /* Before any commit at all, the job restarts from its initial state. */
    in->restore_point = -1;
    in->committed_min = -1;
    o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.rollback == -1, "rollback %lld", g_d.rollback);
    check_roundtrip(&g_d);
}

/* Rank 1's only holder is rank 2's process, which failed too (its heartbeat has not even
 * expired yet: a crash is seen at once). */
static void test_holder_lost_too(void) {
    DecideInput *in = base_input();
    long h1[] = {13}, h2[] = {14}, spares[] = {20, 21};
    int alive[] = {1};
    add_failure(in, 1, "crash", 1000, 1001, 1, h1, alive);
    add_failure(in, 2, "crash", 1000, 1002, 1, h2, alive);
    add_spares(in, 2, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_STATE_LOST, "outcome %s", decide_outcome_name(o));
    CHECK(strstr(g_why, "rank 1 failed (crash) together with every holder of its replicas") != NULL, "%s", g_why);
    CHECK(strstr(g_why, "no checkpoint exists") && strstr(g_why, "--replicas 2"), "%s", g_why);
    /* With a checkpoint on disk the message names it and the command to continue. */
    in->checkpoint_step = 4;
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST, "outcome %s", decide_outcome_name(o));
    CHECK(strstr(g_why, "every holder of its replicas") && strstr(g_why, "checkpoint of step 5") &&
              strstr(g_why, "continue from the checkpoint") && strstr(g_why, "`deadpool run --resume /data/run1 -- ./train --lr 0.1`"),
          "%s", g_why);
    /* A holder whose heartbeat expired is lost as well. */
    in->checkpoint_step = -1;
    in->nfailed = 0;
    long h[] = {14};
    int dead[] = {0};
    add_failure(in, 1, "network", 1000, 1001, 1, h, dead);
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "rank 1 failed (network)"), "%s: %s", decide_outcome_name(o), g_why);
    /* No holder recorded at all: the same. */
    in->nfailed = 0;
    add_failure(in, 3, "hang", 1000, 1001, 0, NULL, NULL);
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "rank 3 failed (hang)"), "%s: %s", decide_outcome_name(o), g_why);
    /* A record of holders that did not verify (forged in Redis) is none, and said so. */
    in->failed[0].holders_refused = 1;
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "record of its replica holders in Redis does not verify"), "%s: %s",
          decide_outcome_name(o), g_why);
    in->failed[0].holders_refused = 0;
    /* Nothing committed yet (rollback to the initial state): nothing to lose, swap. */
    in->restore_point = -1;
    in->committed_min = -1;
    o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.rollback == -1, "%s: %s", decide_outcome_name(o), g_why);
}

/* --replicas 2: one of rank 1's holders failed with it, the other is alive. */
static void test_holder_lost_one_alive(void) {
    DecideInput *in = base_input();
    long h1[] = {13, 14}, h2[] = {14, 11}, spares[] = {20, 21};
    int alive[] = {1, 1};
    add_failure(in, 1, "crash", 1000, 1001, 2, h1, alive);
    add_failure(in, 2, "crash", 1000, 1002, 2, h2, alive);
    add_spares(in, 2, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_SWAP, "outcome %s (%s)", decide_outcome_name(o), g_why);
    CHECK(g_d.nfailed == 2 && g_d.procs[1] == 20 && g_d.procs[2] == 21, "members %ld %ld", g_d.procs[1], g_d.procs[2]);
    /* The surviving holder's heartbeat expired too: now rank 1's state is gone. */
    in->failed[0].holder_alive[1] = 0;
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "rank 1 failed (crash) together with every holder"), "%s: %s",
          decide_outcome_name(o), g_why);
}

/* Plain data parallelism: every rank's state is DP_IDENTICAL, nothing of its own
 * (stateless), so every member keeps all of it in its own snapshots. A world of 3 (procs
 * 11..13, ring holders r + 1). */
static void test_stateless_ranks(void) {
    DecideInput *in = base_input();
    in->world = 3;
    long h0[] = {12}, h1[] = {13}, h2[] = {11}, spares[] = {20, 21, 22};
    int alive[] = {1};
    /* (a) ranks 1 and 2 fail together; rank 1's only holder is rank 2: nothing of its own is
     * lost, rank 0 provides the identical state. */
    add_failure(in, 1, "crash", 1000, 1001, 1, h1, alive)->stateless_through = 9;
    add_failure(in, 2, "crash", 1000, 1002, 1, h2, alive)->stateless_through = 9;
    add_spares(in, 2, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.procs[1] == 20 && g_d.procs[2] == 21 && g_d.rollback == 9, "(a) %s: %s",
          decide_outcome_name(o), g_why);
    /* With state of its own (an extra cursor, a shard) rank 1's state is lost, as before;
     * and so it is with a claim that ends before the rollback (an old one, replayed into
     * Redis: it says nothing about step 9). */
    for (long long through = -1; through <= 8; through += 9) {
        in->failed[0].stateless_through = through;
        o = run(in);
        CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "rank 1 failed (crash) together with every holder of its replicas"),
              "claim through %lld: %s: %s", through, decide_outcome_name(o), g_why);
    }
    /* (b) ranks 0 and 2: rank 2's holder is rank 0, but rank 1 still holds the identical state. */
    in->nfailed = 0;
    add_failure(in, 0, "crash", 1000, 1001, 1, h0, alive)->stateless_through = 9;
    add_failure(in, 2, "crash", 1000, 1002, 1, h2, alive)->stateless_through = 9;
    o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.procs[0] == 20 && g_d.procs[2] == 21, "(b) %s: %s", decide_outcome_name(o), g_why);
    /* ... rank 0 is stateless too when its holder is gone with it. */
    in->nfailed = 0;
    long none[] = {13};
    add_failure(in, 0, "crash", 1000, 1001, 1, none, alive)->stateless_through = 9;
    add_failure(in, 2, "crash", 1000, 1002, 0, NULL, NULL)->stateless_through = 9;
    o = run(in);
    CHECK(o == DECIDE_SWAP, "no holder needed while rank 1 survives: %s: %s", decide_outcome_name(o), g_why);
    /* Every rank fails: only rank 0's replica carries the identical state. */
    in->nfailed = 0;
    add_failure(in, 0, "crash", 1000, 1001, 1, h0, alive)->stateless_through = 9;
    add_failure(in, 1, "crash", 1000, 1002, 1, h1, alive)->stateless_through = 9;
    add_failure(in, 2, "crash", 1000, 1003, 1, h2, alive)->stateless_through = 9;
    add_spares(in, 1, spares + 2);
    o = run(in);
    CHECK(o == DECIDE_STATE_LOST && strstr(g_why, "every rank failed") && strstr(g_why, "held identically is lost") &&
              strstr(g_why, "no checkpoint exists"),
          "%s: %s", decide_outcome_name(o), g_why);
    long outside[] = {30}; /* --replica-placement spares: rank 0's holder is alive */
    in->failed[0].holder_proc[0] = outside[0];
    o = run(in);
    CHECK(o == DECIDE_SWAP, "rank 0's replica on a live spare: %s: %s", decide_outcome_name(o), g_why);
    /* Stateless ranks still need spares. */
    in->nfailed = 0;
    in->nspares = 0;
    add_failure(in, 1, "hang", 1000, 1001, 0, NULL, NULL)->stateless_through = 9;
    o = run(in);
    CHECK(o == DECIDE_NO_SPARE, "%s: %s", decide_outcome_name(o), g_why);
}

static void test_no_spare(void) {
    DecideInput *in = base_input();
    long holders[] = {11};
    int alive[] = {1};
    add_failure(in, 3, "crash", 1000, 1001, 1, holders, alive);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_NO_SPARE, "outcome %s", decide_outcome_name(o));
    CHECK(g_d.rollback == 9, "the rollback to persist: %lld", g_d.rollback);
    CHECK(strstr(g_why, "rank 3 failed (crash) and no spare joined within 30 s") &&
              strstr(g_why, "continue with `deadpool run --resume /data/run1 -- ./train --lr 0.1` (checkpoint of step 10)"),
          "%s", g_why);
}

static void test_fewer_spares_than_failures(void) {
    DecideInput *in = base_input();
    long h0[] = {12}, h2[] = {14}, spares[] = {20};
    int alive[] = {1};
    add_failure(in, 2, "hang", 1000, 1001, 1, h2, alive);
    add_failure(in, 0, "crash", 1000, 1002, 1, h0, alive);
    add_spares(in, 1, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_NO_SPARE, "outcome %s", decide_outcome_name(o));
    CHECK(strstr(g_why, "rank 2 failed (hang) and no spare joined within 30 s"), "%s", g_why);
    /* A second spare arrives: both swapped. */
    long more[] = {19};
    add_spares(in, 1, more);
    o = run(in);
    CHECK(o == DECIDE_SWAP && g_d.procs[2] == 19 && g_d.procs[0] == 20, "%s: %ld %ld", decide_outcome_name(o),
          g_d.procs[2], g_d.procs[0]);
}

static void test_comm_failure_rebuild(void) {
    DecideInput *in = base_input();
    long spares[] = {20};
    add_spares(in, 1, spares);
    decide_outcome o = run(in);
    CHECK(o == DECIDE_WAIT, "nothing failed, no suspicion: %s", decide_outcome_name(o));
    in->suspicion_due = 1;
    o = run(in);
    CHECK(o == DECIDE_REBUILD, "outcome %s", decide_outcome_name(o));
    CHECK(g_d.epoch == 3 && g_d.world == 4 && g_d.nfailed == 0 && g_d.rollback == 9, "epoch %ld nfailed %d rollback %lld",
          g_d.epoch, g_d.nfailed, g_d.rollback);
    for (int r = 0; r < 4; r++) CHECK(g_d.procs[r] == 11 + r, "same members: rank %d -> %ld", r, g_d.procs[r]);
    CHECK(g_d.t_fail_ms == 50000 && g_d.t_detect_ms == 50000, "times of the decision");
    check_roundtrip(&g_d);
    /* Whatever the ft mode: the communicator must be rebuilt all the same. */
    in->ft = FT_DISK;
    o = run(in);
    CHECK(o == DECIDE_REBUILD, "--ft disk: %s", decide_outcome_name(o));
    in->ft = FT_DEADPOOL;
    /* Rebuilt again and again with nothing committed: the job stops, it does not loop. */
    in->fruitless_rebuilds = DECIDE_MAX_FRUITLESS_REBUILDS;
    o = run(in);
    CHECK(o == DECIDE_REBUILD, "a step was committed since (9 > 5): %s", decide_outcome_name(o));
    in->committed_min = 5;
    o = run(in);
    CHECK(o == DECIDE_GIVE_UP && g_d.rollback == 5, "no step since: %s, rollback %lld", decide_outcome_name(o), g_d.rollback);
    CHECK(strstr(g_why, "failed 3 times in a row") && strstr(g_why, "step 6"), "why: %s", g_why);
    in->fruitless_rebuilds = DECIDE_MAX_FRUITLESS_REBUILDS - 1;
    CHECK(run(in) == DECIDE_REBUILD, "one try left");
    long holders[] = {14};
    int alive[] = {1};
    in->fruitless_rebuilds = DECIDE_MAX_FRUITLESS_REBUILDS;
    add_failure(in, 2, "crash", 49000, 49500, 1, holders, alive);
    o = run(in);
    CHECK(o == DECIDE_SWAP, "a failed member is swapped whatever the rebuilds: %s", decide_outcome_name(o));
}

static void test_ft_disk_none(void) {
    DecideInput *in = base_input();
    long holders[] = {11}, spares[] = {20};
    int alive[] = {1};
    add_failure(in, 1, "crash", 1000, 1001, 1, holders, alive);
    add_spares(in, 1, spares);
    in->ft = FT_DISK;
    decide_outcome o = run(in);
    CHECK(o == DECIDE_NO_FT, "outcome %s", decide_outcome_name(o));
    CHECK(!strcmp(g_why, "rank 1 failed (crash); --ft disk has no in-memory snapshots to hot-swap from"), "%s", g_why);
    in->ft = FT_NONE;
    o = run(in);
    CHECK(o == DECIDE_NO_FT && strstr(g_why, "--ft none has no in-memory snapshots"), "%s", g_why);
}

static void test_invalid_input(void) {
    DecideInput *in = base_input();
    in->world = 0;
    CHECK(run(in) == DECIDE_INVALID && strstr(g_why, "world 0"), "%s", g_why);
    in->world = DP_MAX_RANKS + 1;
    CHECK(run(in) == DECIDE_INVALID, "world over the limit");
    in = base_input();
    add_failure(in, 4, "crash", 1, 1, 0, NULL, NULL);
    CHECK(run(in) == DECIDE_INVALID && strstr(g_why, "failed rank 4"), "%s", g_why);
    in = base_input();
    add_failure(in, 1, "crash", 1, 1, 0, NULL, NULL);
    add_failure(in, 1, "crash", 1, 1, 0, NULL, NULL);
    CHECK(run(in) == DECIDE_INVALID && strstr(g_why, "twice"), "%s", g_why);
    /* No message buffer: still decides. */
    in = base_input();
    in->suspicion_due = 1;
    CHECK(decide_next(in, &g_d, NULL, 0) == DECIDE_REBUILD, "why may be NULL");
}

/* The largest decision the limits allow: every rank failed, proc ids of 19 digits. */
static void test_decision_roundtrip_full(void) {
    Decision *d = &g_d;
    memset(d, 0, sizeof *d);
    d->epoch = 123456789;
    d->world = DP_MAX_RANKS;
    d->rollback = 987654321012LL;
    d->t_fail_ms = -5;
    d->t_detect_ms = INT64_MAX;
    d->t_decide_ms = 1700000000123LL;
    for (int r = 0; r < d->world; r++) {
        FailedRank *f = &d->failed[d->nfailed++];
        f->rank = d->world - 1 - r;
        f->old_proc = 1000000000000000000L + r;
        f->spare_proc = 2000000000000000000L + r;
        snprintf(f->kind, sizeof f->kind, "%s", r % 2 ? "network" : "abcdefghijklmno");
        d->procs[f->rank] = f->spare_proc;
    }
    check_roundtrip(d);
    CHECK(strlen(g_text) < sizeof g_text, "fits");
    /* Too small a buffer is refused, not truncated. */
    CHECK(decision_format(d, g_text, 100) == -1, "small buffer");
    CHECK(decision_format(d, g_text, 0) == -1, "no buffer");
    /* Format refuses what parse would refuse. */
    d->world = 0;
    CHECK(decision_format(d, g_text, sizeof g_text) == -1, "world 0");
    d->world = DP_MAX_RANKS;
    d->procs[7] = 0;
    CHECK(decision_format(d, g_text, sizeof g_text) == -1, "proc 0");
}

static const char *VALID =
    "epoch=3\nworld=4\nrollback=9\nt_fail_ms=1000\nt_detect_ms=1005\nt_decide_ms=1010\n"
    "rank=0:11\nrank=1:12\nrank=2:20\nrank=3:14\nnfailed=1\nfailed=2:crash:13:20\n";

/* VALID with `from` replaced by `to` (first occurrence). */
static const char *variant(const char *from, const char *to) {
    static char buf[1024];
    const char *at = strstr(VALID, from);
    if (!at) return "missing";
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - VALID), VALID, to, at + strlen(from));
    return buf;
}

static int refused(const char *text, const char *what, const char *need) {
    char err[256] = "";
    memset(&g_d, 0x5A, sizeof g_d);
    int rc = decision_parse(text, &g_d, err, sizeof err);
    if (rc != -1) {
        fprintf(stderr, "  accepted (%s):\n%s", what, text);
        return 0;
    }
    if (!err[0] || (need && !strstr(err, need))) {
        fprintf(stderr, "  refused (%s) without the expected message ('%s'): %s\n", what, need ? need : "", err);
        return 0;
    }
    if (g_d.world != 0 || g_d.nfailed != 0) {
        fprintf(stderr, "  refused (%s) but left a partial decision\n", what);
        return 0;
    }
    return 1;
}

static void test_decision_parse_valid(void) {
    char err[256] = "";
    CHECK(decision_parse(VALID, &g_d, err, sizeof err) == 0, "%s", err);
    CHECK(g_d.epoch == 3 && g_d.world == 4 && g_d.rollback == 9 && g_d.t_fail_ms == 1000 && g_d.t_detect_ms == 1005 &&
              g_d.t_decide_ms == 1010,
          "header");
    CHECK(g_d.procs[2] == 20 && g_d.nfailed == 1 && g_d.failed[0].rank == 2 && g_d.failed[0].old_proc == 13 &&
              g_d.failed[0].spare_proc == 20 && !strcmp(g_d.failed[0].kind, "crash"),
          "failed entry");
    CHECK(decision_rank_of(&g_d, 20) == 2 && decision_rank_of(&g_d, 13) == -1, "rank_of");
    /* Lines in another order are fine; rollback -1 (the initial state) too. */
    CHECK(decision_parse("rank=0:5\nnfailed=0\nworld=1\nepoch=1\nrollback=-1\nt_fail_ms=0\nt_detect_ms=0\nt_decide_ms=0\n",
                         &g_d, err, sizeof err) == 0 && g_d.rollback == -1 && g_d.procs[0] == 5,
          "%s", err);
    CHECK(decision_parse(VALID, &g_d, NULL, 0) == 0, "err may be NULL");
}

static void test_decision_parse_truncated(void) {
    size_t n = strlen(VALID);
    char buf[1024];
    int all = 1;
    for (size_t k = 0; k < n; k++) { /* every strict prefix */
        memcpy(buf, VALID, k);
        buf[k] = 0;
        char what[32];
        snprintf(what, sizeof what, "prefix of %zu bytes", k);
        if (!refused(buf, what, NULL)) all = 0;
    }
    CHECK(all, "every truncated text must be refused");
    CHECK(refused(variant("failed=2:crash:13:20\n", "failed=2:crash:13:2"), "cut inside the last number", "truncated"),
          "unterminated last line");
}

static void test_decision_parse_out_of_range(void) {
    CHECK(refused(variant("world=4", "world=0"), "world 0", "world"), "world 0");
    CHECK(refused(variant("world=4", "world=1025"), "world 1025", "world"), "world 1025");
    CHECK(refused(variant("world=4", "world=-4"), "world -4", "world"), "world -4");
    CHECK(refused(variant("world=4", "world=99999999999999999999"), "world overflow", "world"), "world overflow");
    CHECK(refused(variant("rank=3:14", "rank=1024:14"), "rank 1024", "rank"), "rank beyond the limit");
    CHECK(refused(variant("rank=3:14", "rank=-1:14"), "rank -1", "rank"), "negative rank");
    CHECK(refused(variant("rank=3:14\n", "rank=3:14\nrank=4:15\n"), "rank 4 of world 4", "rank 4"), "rank >= world");
    CHECK(refused(variant("world=4", "world=3"), "world 3 with 4 ranks", NULL), "rank >= world");
    CHECK(refused(variant("world=4", "world=5"), "world 5 with 4 ranks", "rank 4"), "missing rank");
    CHECK(refused(variant("failed=2:crash:13:20", "failed=4:crash:13:20"), "failed rank 4 of world 4", "rank 4"),
          "failed rank >= world");
    CHECK(refused(variant("failed=2:crash:13:20", "failed=1024:crash:13:20"), "failed rank 1024", "1024"),
          "failed rank beyond the limit");
    CHECK(refused(variant("rollback=9", "rollback=-2"), "rollback -2", "rollback"), "rollback below -1");
    CHECK(refused(variant("rank=3:14", "rank=3:0"), "proc 0", NULL), "proc 0");
    CHECK(refused(variant("epoch=3", "epoch=-3"), "epoch -3", "epoch"), "negative epoch");
}

static void test_decision_parse_malformed(void) {
    static const char *const bad[][2] = {
        {"epoch=3", "epoch=abc"},
        {"epoch=3", "epoch=3 "},
        {"epoch=3", "epoch= 3"},
        {"epoch=3", "epoch="},
        {"epoch=3", "epoch3"},
        {"epoch=3\n", "epoch=3\n\n"},
        {"epoch=3\n", "epoch=3\nepoch=4\n"},
        {"epoch=3\n", "epoch=3\nbogus=1\n"},
        {"epoch=3\n", ""},
        {"t_decide_ms=1010\n", ""},
        {"nfailed=1\n", ""},
        {"nfailed=1", "nfailed=2"},
        {"nfailed=1", "nfailed=0"},
        {"rank=1:12", "rank=1:"},
        {"rank=1:12", "rank=1:12:7"},
        {"rank=1:12", "rank=1:0x10"},
        {"rank=1:12", "rank=:12"},
        {"rank=1:12\n", "rank=1:12\nrank=1:12\n"},
        {"failed=2:crash:13:20", "failed=2:crash:13"},
        {"failed=2:crash:13:20", "failed=2::13:20"},
        {"failed=2:crash:13:20", "failed=2:abcdefghijklmnop:13:20"},
        {"failed=2:crash:13:20", "failed=2:crash:13:21"},  /* the spare is not rank 2's owner */
        {"failed=2:crash:13:20", "failed=2:crash:13:20:9"},
        {"failed=2:crash:13:20\n", "failed=2:crash:13:20\nfailed=2:crash:13:20\n"},
    };
    int n = (int)(sizeof bad / sizeof bad[0]);
    for (int i = 0; i < n; i++) {
        char what[128];
        snprintf(what, sizeof what, "'%s' -> '%s'", bad[i][0], bad[i][1]);
        CHECK(refused(variant(bad[i][0], bad[i][1]), what, NULL), "%s", what);
    }
    CHECK(refused("", "empty", NULL), "empty text");
}

/* Whole machines: 3 machines x 2 ranks (machine of rank r = r / 2), rank 6 joined by hand. */
static void test_nodes_lost(void) {
    int node[7] = {0, 0, 1, 1, 2, 2, -1}, alive[7], node_alive[3], fail[7];
    for (int r = 0; r < 7; r++) alive[r] = 1;
    for (int k = 0; k < 3; k++) node_alive[k] = 1;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 0, "all alive: nobody fails");
    /* rank 2 silent, its machine's launcher alive: it hangs by itself, fails alone (not here) */
    alive[2] = 0;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 0, "a lone hang is not a machine loss");
    /* machine 1's launcher silent too: both its ranks, the one still heartbeating included */
    node_alive[1] = 0;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 2 && fail[2] && fail[3] && !fail[0] && !fail[4],
          "machine 1 lost as a whole");
    /* a machine whose launcher is silent but whose ranks all heartbeat: nothing yet */
    alive[2] = 1;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 0, "a silent launcher alone fails no rank");
    /* a hand-joined process (no machine) fails alone, never drags others */
    alive[6] = 0;
    node_alive[1] = 1;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 0, "no machine, no machine loss");
    /* two machines at once */
    alive[0] = alive[4] = 0;
    node_alive[0] = node_alive[2] = 0;
    CHECK(decide_nodes_lost(7, node, alive, node_alive, 3, fail) == 4 && fail[0] && fail[1] && fail[4] && fail[5],
          "machines 0 and 2 lost");
}

/* Resuming from private disks: the newest step all ranks of which are on some machine. */
static void test_resume_choose(void) {
    char why[256];
    const char *a[] = {"99:0,1;49:0,1", "99:2;49:2,3", ""};
    CHECK(resume_choose(a, 3, 4, why, sizeof why) == 49, "step 99 lacks rank 3: step 49");
    CHECK(strstr(why, "step 100") && strstr(why, " 3"), "why names the newest step and its missing rank: %s", why);
    const char *b[] = {"99:0,1;49:0,1", "99:2,3;49:2,3"};
    CHECK(resume_choose(b, 2, 4, why, sizeof why) == 99 && why[0] == 0, "both machines together have step 99");
    const char *c[] = {"99:0,1,2,3"};
    CHECK(resume_choose(c, 1, 4, why, sizeof why) == 99, "one machine with everything");
    const char *d[] = {"", ""};
    CHECK(resume_choose(d, 2, 4, why, sizeof why) == -1 && strstr(why, "no machine"), "nothing: %s", why);
    const char *e[] = {"99:0,1", "x:2,3", "99:9"};
    CHECK(resume_choose(e, 3, 4, why, sizeof why) == -1, "malformed and out-of-range entries count for nothing");
    const char *f[] = {"149:1;99:0,1", "149:0;99:2,3"};
    CHECK(resume_choose(f, 2, 2, why, sizeof why) == 149, "the newest covered step wins (2 ranks)");
    /* Each inventory is protocol.h's text: one the parser refuses counts for nothing, and why says so. */
    const char *g[] = {"99:0,1", "99:1,0;49:0,1"};
    CHECK(resume_choose(g, 2, 2, why, sizeof why) == 99 && strstr(why, "inventory 2 of 2 refused") &&
              strstr(why, "ascending"), "a refused inventory: %s", why);
    const char *h[] = {"49:0,1;99:0,1"};
    CHECK(resume_choose(h, 1, 2, why, sizeof why) == -1 && strstr(why, "newest first"), "steps out of order: %s", why);
}

/* Reports (recovery.h): every kind and phase round-trips, text with any byte but NUL included. */
static void test_report_roundtrip(void) {
    for (int k = 0; k < REPORT_KINDS; k++)
        for (int ph = 0; ph < JOIN_PHASES; ph++) {
            Report r = {.kind = (report_kind)k, .epoch = k - 1, .rank = ph ? RECOVERY_MAX_RANKS - 1 : -1,
                        .step = 1000000000000LL * k - 1, .t_wall_ms = 1733000000000LL + k, .phase = (join_phase)ph};
            snprintf(r.text, sizeof r.text, "line one\nsecond \"quoted\" line: %s %d\t\x01", report_kind_name(r.kind), k);
            char buf[REPORT_TEXT_MAX], err[256];
            Report back;
            int ok = report_format(&r, buf, sizeof buf) == 0 && report_parse(buf, strlen(buf), &back, err, sizeof err) == 0;
            CHECK(ok && memcmp(&r, &back, offsetof(Report, text)) == 0 && !strcmp(r.text, back.text),
                  "%s/%s round-trips", report_kind_name(r.kind), join_phase_name(r.phase));
        }
    Report full = {.kind = REPORT_DIVERGED, .epoch = 1, .rank = 0, .step = 5, .t_wall_ms = 1};
    memset(full.text, 'x', sizeof full.text - 1);
    char buf[REPORT_TEXT_MAX];
    Report back;
    CHECK(report_format(&full, buf, sizeof buf) == 0 && report_parse(buf, strlen(buf), &back, NULL, 0) == 0 &&
              strlen(back.text) == sizeof full.text - 1,
          "the longest text fits REPORT_TEXT_MAX");
    Report bad = full;
    bad.kind = REPORT_KINDS;
    CHECK(report_format(&bad, buf, sizeof buf) == -1, "no kind out of range is written");
    bad = full;
    bad.rank = RECOVERY_MAX_RANKS;
    CHECK(report_format(&bad, buf, sizeof buf) == -1, "no rank out of range is written");
    CHECK(report_format(&full, buf, 40) == -1, "a buffer too small is refused");
}

static void test_report_parse_refuses(void) {
    static const char *const bad[][2] = {
        {"comm_failure 3 1 7 1000 rendezvous", "no header line"},
        {"comm_failur 3 1 7 1000 rendezvous\n", "unknown kind"},
        {"comm_failure 3 1 7 1000 restor\n", "unknown phase"},
        {"comm_failure 3 1 7 1000\n", "expected 6 header fields"},
        {"comm_failure 3 1 7\n", "expected 6 header fields"},
        {"comm_failure 3  1 7 1000 rendezvous\n", "more than 6 header fields"},
        {"comm_failure 3 1 7 1000 rendezvous \n", "more than 6 header fields"},
        {"comm_failure -2 1 7 1000 rendezvous\n", "out of range or malformed"},
        {"comm_failure 3 100000 7 1000 rendezvous\n", "out of range or malformed"},
        {"comm_failure 3 1 7 -5 rendezvous\n", "out of range or malformed"},
        {"comm_failure 3 1 0x7 1000 rendezvous\n", "out of range or malformed"},
        {"comm_failure 3 1 99999999999999999999 1000 rendezvous\n", "out of range or malformed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Report r;
        char err[256] = "";
        int rc = report_parse(bad[i][0], strlen(bad[i][0]), &r, err, sizeof err);
        CHECK(rc == -1 && strstr(err, bad[i][1]) && r.kind == 0 && r.text[0] == 0, "'%s' refused: %s", bad[i][0], err);
    }
    char big[REPORT_TEXT_MAX + 16];
    int n = snprintf(big, sizeof big, "job_done 1 0 5 1 rendezvous\n");
    memset(big + n, 'y', sizeof big - (size_t)n - 1);
    big[sizeof big - 1] = 0;
    Report r;
    char err[256] = "";
    CHECK(report_parse(big, strlen(big), &r, err, sizeof err) == -1 && strstr(err, "text of"), "text too long: %s", err);
    const char nul[] = "job_done 1 0 5 1 rendezvous\nab\0cd";
    CHECK(report_parse(nul, sizeof nul - 1, &r, err, sizeof err) == -1 && strstr(err, "NUL"), "a NUL in the text: %s", err);
}

/* Issue 27, item 11: "Redis unreachable" is no evidence of a death. While the control plane is
 * away, and for a detect timeout after it answers again, silence is not judged and nothing is
 * decided: a failure that is pending then waits. */
static void test_control_plane_outage(void) {
    DecideControl dc = {.now_ms = 10000, .reachable = 1, .back_since_ms = 0, .detect_timeout_ms = 2000};
    CHECK(decide_control_settled(&dc), "never away: silence counts");
    dc.reachable = 0;
    CHECK(!decide_control_settled(&dc), "unreachable: a heartbeat that cannot be read is no death");
    dc.reachable = 1;
    dc.back_since_ms = 9000;
    CHECK(!decide_control_settled(&dc), "back 1 s ago (detect 2 s): heartbeats that expired meanwhile are no death yet");
    dc.back_since_ms = 8000;
    CHECK(decide_control_settled(&dc), "back a whole detect timeout ago: silence counts again");

    DecideInput *in = base_input();
    long holders[] = {14}, spares[] = {20};
    int alive[] = {1};
    add_failure(in, 2, "crash", 1000, 1005, 1, holders, alive);
    add_spares(in, 1, spares);
    in->control_unsettled = 1;
    decide_outcome o = run(in);
    CHECK(o == DECIDE_WAIT, "a failure while the control plane is unsettled waits: %s", decide_outcome_name(o));
    in->nfailed = 0;
    in->suspicion_due = 1;
    CHECK(run(in) == DECIDE_WAIT, "so does a failed collective");
    in->suspicion_due = 0;
    add_failure(in, 2, "crash", 1000, 1005, 1, holders, alive);
    in->control_unsettled = 0;
    CHECK(run(in) == DECIDE_SWAP && g_d.rollback == 9, "settled: the swap is decided");
}

/* After an outage a rank that died while Redis was away may have committed more than its
 * records say: its holders' newest generation counts, and the result is what every rank has. */
static void test_committed_after_outage(void) {
    long long committed[3] = {41, 40, 17}, held[3] = {-1, -1, 40};
    int failed[3] = {0, 0, 1};
    CHECK(decide_committed_min(3, committed, failed, held) == 40, "the dead rank's stale record 17 yields to its holders' 40: %lld",
          decide_committed_min(3, committed, failed, held));
    held[2] = 41;
    CHECK(decide_committed_min(3, committed, failed, held) == 40, "holders ahead of a survivor: the survivor's 40");
    held[2] = -1;
    CHECK(decide_committed_min(3, committed, failed, held) == 17, "no holder reported: the record, 17");
    held[2] = 12;
    committed[2] = 40;
    CHECK(decide_committed_min(3, committed, failed, held) == 40, "a holder's report older than the record: the record");
    held[0] = 99;
    CHECK(decide_committed_min(3, committed, failed, held) == 40, "only failed ranks' holders count: %lld",
          decide_committed_min(3, committed, failed, held));
    committed[1] = -1;
    CHECK(decide_committed_min(3, committed, failed, held) == -1, "a rank with nothing committed: -1");
}

/* The coordinator's view of the control plane, one liveness query at a time (detect 2 s, so a
 * view older than 1 s is stale). */
static void test_control_view(void) {
    ControlView v = {.reachable = 1};
    CHECK(decide_control_observe(&v, 1, 0, 1000, 2000) == CONTROL_OK && v.last_ok_ms == 1000, "first answer: ok");
    CHECK(decide_control_observe(&v, 1, 0, 1400, 2000) == CONTROL_OK && v.back_since_ms == 0, "0.4 s later: ok");
    CHECK(decide_control_observe(&v, 0, 1, 1500, 2000) == CONTROL_WENT_AWAY && !v.reachable && v.unreachable_since_ms == 1500,
          "no answer: the outage begins at 1500");
    CHECK(decide_control_observe(&v, 0, 1, 4500, 2000) == CONTROL_STILL_AWAY && v.unreachable_since_ms == 1500,
          "still none: it began at 1500 still");
    CHECK(decide_control_observe(&v, 1, 0, 5000, 2000) == CONTROL_BACK && v.reachable && v.back_since_ms == 5000 &&
              v.unreachable_since_ms == 0, "answers again: back, settling from 5000");
    DecideControl dc = {.now_ms = 6000, .reachable = v.reachable, .back_since_ms = v.back_since_ms, .detect_timeout_ms = 2000};
    CHECK(!decide_control_settled(&dc), "1 s after: not settled");
    CHECK(decide_control_observe(&v, 1, 1, 5200, 2000) == CONTROL_BACK && v.back_since_ms == 5200,
          "a call found Redis absent since the last look (a restart over before this query): back again");
    CHECK(decide_control_observe(&v, 1, 0, 6500, 2000) == CONTROL_STALE && v.back_since_ms == 6500,
          "answered 1.3 s after the last answer (more than half a detect timeout): stale, settling again");
    /* A WAIT Redis answered: the coordinator's own blocking is no gap (the Slurm node loss). */
    CHECK(decide_control_observe(&v, 1, 0, 6600, 2000) == CONTROL_OK, "0.1 s later: ok");
    decide_control_waited(&v, 1000);
    CHECK(decide_control_observe(&v, 1, 0, 7700, 2000) == CONTROL_OK,
          "1.1 s later, 1 s of it in a WAIT Redis answered: ok, not stale");
    CHECK(decide_control_observe(&v, 1, 0, 8900, 2000) == CONTROL_STALE, "1.2 s later with no WAIT: stale");
    ControlView never = {.reachable = 1};
    decide_control_waited(&never, 1000);
    CHECK(never.last_ok_ms == 0, "a wait before any answer moves nothing");
}

/* Which spares a decision may use (the coordinator's live_spares). */
static void test_spares_usable(void) {
    long ids[] = {7, 8, 9, 10}, out[4];
    int alive[] = {1, 0, 1, 1};
    CHECK(decide_spares_usable(ids, alive, NULL, 4, NULL, 0, out, 4) == 3 && out[0] == 7 && out[1] == 9 && out[2] == 10,
          "one machine: the live ones, in the pool's order");
    CHECK(decide_spares_usable(ids, alive, NULL, 4, NULL, 0, out, 2) == 2 && out[1] == 9, "at most max");
    const char *nodes[] = {"m1", "m2", "m2", ""}, *failed[] = {"m2"};
    CHECK(decide_spares_usable(ids, alive, nodes, 4, failed, 1, out, 4) == 2 && out[0] == 7 && out[1] == 10,
          "not a spare on the failed rank's machine; an unknown machine is no suspect");
    const char *failed2[] = {"m1", "m2"};
    CHECK(decide_spares_usable(ids, alive, nodes, 4, failed2, 2, out, 4) == 1 && out[0] == 10, "two machines lost: only the unknown one");
    int none[] = {0, 0, 0, 0};
    CHECK(decide_spares_usable(ids, none, NULL, 4, NULL, 0, out, 4) == 0, "none alive: none");
}

/* A silent local member's kind from its /proc/PID/stat text (coordinator.c silent_kind reads
 * the file). The comm, in parentheses, may hold spaces and ')': the state follows the last ')'. */
static void test_silent_kind(void) {
    const char *tail = " 1 4711 4711 0 -1 4194560 2035 0 0 0 12 3 0 0 20 0 3 0 87211 23404544 2367 "
                       "18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0";
    char line[512];
    const struct { char state; const char *kind; } states[] = {
        {'R', "network"}, {'S', "network"}, {'D', "network"}, {'I', "network"}, {'X', "network"},
        {'T', "hang"},    {'t', "hang"},    {'Z', "crash"},
    };
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        snprintf(line, sizeof line, "4711 (python3) %c%s\n", states[i].state, tail);
        CHECK(!strcmp(decide_silent_kind(line), states[i].kind), "state %c: %s, expected %s", states[i].state,
              decide_silent_kind(line), states[i].kind);
    }
    CHECK(!strcmp(decide_silent_kind(NULL), "crash"), "no stat file: the process is gone");
    /* comm names that look like the rest of the line */
    CHECK(!strcmp(decide_silent_kind("4711 (a) T (b) R 1 4711 4711 0\n"), "network"), "comm 'a) T (b': running");
    CHECK(!strcmp(decide_silent_kind("4711 (x) R y) T 1 4711 4711 0\n"), "hang"), "comm 'x) R y': stopped");
    CHECK(!strcmp(decide_silent_kind("4711 (train)) Z 1 4711 4711 0\n"), "crash"), "comm 'train)': zombie");
    CHECK(!strcmp(decide_silent_kind("4711 (my worker) t 1 4711 4711 0\n"), "hang"), "comm with a space: traced");
    CHECK(!strcmp(decide_silent_kind("4711 (() Z 1 4711 4711 0\n"), "crash"), "comm '(': zombie");
    /* nothing to read a state from: running, yet unheard (as before the split) */
    CHECK(!strcmp(decide_silent_kind(""), "network"), "empty text");
    CHECK(!strcmp(decide_silent_kind("4711 (pyth"), "network"), "cut inside the comm");
    CHECK(!strcmp(decide_silent_kind("4711 (python3)"), "network"), "cut after the comm");
    CHECK(!strcmp(decide_silent_kind("4711 (python3) "), "network"), "cut before the state");
    CHECK(!strcmp(decide_silent_kind("4711 (python3)T 1"), "network"), "no space before the state");
    /* this process's own stat, as the kernel writes it: running */
    char self[512] = "";
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        size_t n = fread(self, 1, sizeof self - 1, f);
        self[n] = 0;
        fclose(f);
    }
    CHECK(!strcmp(decide_silent_kind(self), "network"), "this process (state R): %s", self);
}

/* Probing the members after a failed collective (coordinator.c probe_members): whom it asks,
 * what a refusal means, and when the death is dated. */
static void test_probe_members(void) {
    /* 6 ranks: rank 1 left on purpose, rank 3 failed already */
    char departed[6] = {0, 1, 0, 0, 0, 0}, pending[6] = {0, 0, 0, 1, 0, 0};
    int who[6], dead[6];
    int n = decide_probe_whom(6, departed, pending, who);
    CHECK(n == 4 && who[0] == 0 && who[1] == 2 && who[2] == 4 && who[3] == 5,
          "neither departed nor pending, in rank order: %d ranks", n);
    char none[6] = {0};
    CHECK(decide_probe_whom(6, none, none, who) == 6 && who[5] == 5, "nobody known: everybody");
    char all[6] = {1, 1, 1, 1, 1, 1};
    CHECK(decide_probe_whom(6, all, none, who) == 0 && decide_probe_whom(6, none, all, who) == 0,
          "everybody departed, or everybody failed: nobody");

    n = decide_probe_whom(6, departed, pending, who);
    int state[4] = {1, 0, -1, 0}; /* rank 0 answers, 2 refuses, 4 is silent, 5 refuses */
    memset(dead, 0xAB, sizeof dead);
    CHECK(decide_probe_dead(6, who, state, n, departed, pending, dead) == 2 && dead[2] && dead[5], "refused: dead");
    CHECK(!dead[0] && !dead[1] && !dead[3] && !dead[4], "an answer, no answer (a cut link), and the unprobed: not dead");
    int refused[4] = {0, 0, 0, 0};
    pending[5] = 1; /* failed meanwhile */
    departed[2] = 1;
    CHECK(decide_probe_dead(6, who, refused, n, departed, pending, dead) == 2 && dead[0] && dead[4] && !dead[2] && !dead[5],
          "a rank departed or pending meanwhile is not failed again");
    CHECK(decide_probe_dead(6, who, NULL, n, departed, pending, dead) == 0 && !dead[0] && !dead[4],
          "no probe made: nobody");
    CHECK(decide_probe_dead(6, who, refused, 0, departed, pending, dead) == 0, "nobody probed: nobody");

    CHECK(decide_fail_time(5000, 0) == 5000, "no report: its own time");
    CHECK(decide_fail_time(5000, 4200) == 4200, "the report came earlier: dated there");
    CHECK(decide_fail_time(5000, 5300) == 5000, "a later report: its own time");
    CHECK(decide_fail_time(5000, -1) == 5000, "a negative time is none");
}

/* Which machines' ranks get probed when their launcher key expires (coordinator.c
 * watch_machines). Machines m0 (this launcher's), m1, m2, m3 (no member) and m4 (a slot
 * outside the marks); ranks 0-1 on m0, 2-3 on m1, 4 on m2, 5 on a machine not known. */
static void test_machines_to_probe(void) {
    int index[5] = {0, 1, 2, 3, 6}, present[5] = {1, 1, 1, 1, 1};
    const char *id[5] = {"m0", "m1", "m2", "m3", "m4"};
    const char *rank_node[7] = {"m0", "m0", "m1", "m1", "m2", "", "m4"};
    char probed[8] = {0};
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 0 &&
              !memchr(probed, 1, sizeof probed), "every key there: nothing");
    present[1] = 0;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 1 && probed[1] == 1 &&
              !probed[0] && !probed[2], "m1's key gone: m1 probed");
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 0 && probed[1] == 1,
          "still gone: not probed again, still marked");
    present[1] = 1;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 0 && probed[1] == 0,
          "its key came back (a slow launcher): the mark is cleared");
    present[1] = 0;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 1 && probed[1] == 1,
          "gone again: probed again");
    present[0] = 0;
    probed[0] = 1;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 0 && probed[0] == 0,
          "my own machine, key gone or not: never probed, its mark cleared");
    present[3] = 0;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 0 && !probed[3],
          "a machine without members (a spare machine): not probed");
    present[4] = 0;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 7, probed, 6) == 0 && !probed[6] && !probed[7],
          "a machine whose slot is outside the marks: skipped, nothing written");
    probed[1] = 0;
    present[2] = 0;
    CHECK(decide_machines_to_probe(5, index, id, present, "m0", rank_node, 6, probed, 6) == 2 && probed[1] && probed[2],
          "two machines gone at once: both");
    CHECK(decide_machines_to_probe(0, index, id, present, "m0", rank_node, 6, probed, 6) == 0 && probed[1] && probed[2],
          "no machine registered: nothing changes");
}

/* The verdict on each rank when members fall silent (coordinator.c silent_members). 8 ranks:
 * machine of rank r = r / 2 for ranks 0-5, rank 6 joined by hand (no machine), rank 7 alone on
 * machine 3. */
static struct {
    int alive[8], node[8], node_alive[4];
    char departed[8], pending[8];
    ExitRecord ex[8];
    silent_verdict v[8];
    int64_t t[8];
} g_s;
static void silent_reset(void) {
    static const int node[8] = {0, 0, 1, 1, 2, 2, -1, 3};
    memset(&g_s, 0, sizeof g_s);
    for (int r = 0; r < 8; r++) {
        g_s.alive[r] = 1;
        g_s.node[r] = node[r];
        g_s.ex[r] = (ExitRecord){.how = EXITED_HOWS, .wall_ms = 0};
    }
    for (int k = 0; k < 4; k++) g_s.node_alive[k] = 1;
}
static int silent_run(void) {
    memset(g_s.v, 0xAB, sizeof g_s.v); /* every verdict must be written */
    memset(g_s.t, 0xAB, sizeof g_s.t);
    return decide_silent_members(8, g_s.alive, g_s.departed, g_s.pending, g_s.ex, g_s.node, g_s.node_alive, 4, g_s.v, g_s.t);
}
static int silent_none_but(int a, int b) { /* every verdict SILENT_NONE and t 0, ranks a and b aside */
    for (int r = 0; r < 8; r++)
        if (r != a && r != b && (g_s.v[r] != SILENT_NONE || g_s.t[r] != 0)) return 0;
    return 1;
}
static void test_silent_members(void) {
    silent_reset();
    CHECK(silent_run() == -1 && silent_none_but(-1, -1), "all heartbeating: nothing");

    g_s.alive[0] = 0;
    CHECK(silent_run() == -1 && g_s.v[0] == SILENT_PROC && g_s.t[0] == 0 && silent_none_but(0, -1),
          "silent, no exit record, its launcher alive: classed by its process, alone");
    g_s.ex[0] = (ExitRecord){.how = EXITED_CRASH, .wall_ms = 1234};
    CHECK(silent_run() == -1 && g_s.v[0] == SILENT_CRASH && g_s.t[0] == 1234 && silent_none_but(0, -1),
          "a crash record: crash, dated by the record");
    g_s.ex[0].wall_ms = 0;
    CHECK(silent_run() == -1 && g_s.v[0] == SILENT_CRASH && g_s.t[0] == 0, "a crash record without a time: no date");
    g_s.ex[0] = (ExitRecord){.how = EXITED_DEPARTED, .wall_ms = 1500};
    CHECK(silent_run() == -1 && g_s.v[0] == SILENT_DEPARTED && g_s.t[0] == 0 && silent_none_but(0, -1),
          "a departed record: departed, no failure");
    g_s.node_alive[0] = 0;
    CHECK(silent_run() == -1 && g_s.v[0] == SILENT_DEPARTED && g_s.v[1] == SILENT_NONE,
          "departed by its record on a machine whose launcher is silent: its machine is not lost for it");
    g_s.alive[0] = 1;
    g_s.node_alive[0] = 1;
    CHECK(silent_run() == -1 && silent_none_but(-1, -1), "a departed record of a rank that heartbeats: nothing");

    silent_reset();
    g_s.alive[2] = 0;
    g_s.node_alive[1] = 0;
    CHECK(silent_run() == -1 && g_s.v[2] == SILENT_NODE && g_s.v[3] == SILENT_NODE && silent_none_but(2, 3),
          "silent on a machine whose launcher is silent: the machine is lost, its heartbeating rank 3 too");
    g_s.ex[2] = (ExitRecord){.how = EXITED_CRASH, .wall_ms = 900};
    CHECK(silent_run() == -1 && g_s.v[2] == SILENT_NODE && g_s.t[2] == 900 && g_s.t[3] == 0,
          "a lost machine's rank with a crash record: lost with its machine, dated by the record");
    g_s.pending[2] = 1;
    CHECK(silent_run() == -1 && g_s.v[2] == SILENT_NONE && g_s.v[3] == SILENT_NODE && silent_none_but(3, -1),
          "the silent rank failed already: not again, but its machine is still lost with rank 3");
    g_s.pending[2] = 0;
    g_s.departed[2] = 1;
    CHECK(silent_run() == -1 && silent_none_but(-1, -1), "the silent rank departed before: its machine is not lost, nothing");
    g_s.alive[3] = 0;
    g_s.departed[3] = 0;
    CHECK(silent_run() == -1 && g_s.v[2] == SILENT_NONE && g_s.v[3] == SILENT_NODE, "...until rank 3 falls silent");

    silent_reset();
    g_s.alive[6] = 0; /* no machine: never a machine loss, whatever the launchers */
    for (int k = 0; k < 4; k++) g_s.node_alive[k] = 0;
    CHECK(silent_run() == -1 && g_s.v[6] == SILENT_PROC && silent_none_but(6, -1),
          "a rank joined by hand fails alone; launchers silent without a silent member lose nothing");

    silent_reset();
    g_s.alive[6] = g_s.alive[7] = 0;
    g_s.ex[6] = (ExitRecord){.how = EXITED_BAD_JOB, .wall_ms = 700};
    CHECK(silent_run() == 6 && g_s.v[6] == SILENT_PROC && g_s.t[6] == 700 && g_s.v[7] == SILENT_PROC && g_s.t[7] == 0,
          "a bad job: reported, the rank still fails, dated by the record");
    g_s.ex[7] = (ExitRecord){.how = EXITED_BAD_JOB, .wall_ms = 800};
    CHECK(silent_run() == 7, "two bad jobs: the highest rank is named");
    g_s.pending[7] = 1;
    g_s.departed[6] = 1;
    CHECK(silent_run() == -1 && silent_none_but(-1, -1), "bad jobs of ranks departed or failed already: nothing");
    g_s.alive[6] = 1;
    g_s.departed[6] = 0;
    CHECK(silent_run() == -1, "a bad job record of a rank that heartbeats: nothing");

    silent_reset();
    g_s.alive[4] = 0;
    g_s.ex[4] = (ExitRecord){.how = EXITED_CRASH, .wall_ms = 50};
    CHECK(decide_silent_members(8, g_s.alive, g_s.departed, g_s.pending, g_s.ex, g_s.node, g_s.node_alive, 4, g_s.v, NULL) == -1 &&
              g_s.v[4] == SILENT_CRASH, "without times: the verdicts alone");
    CHECK(decide_silent_members(-1, g_s.alive, g_s.departed, g_s.pending, g_s.ex, g_s.node, g_s.node_alive, 4, g_s.v, g_s.t) == -1 &&
              decide_silent_members(DP_MAX_RANKS + 1, g_s.alive, g_s.departed, g_s.pending, g_s.ex, g_s.node, g_s.node_alive, 4,
                                    g_s.v, g_s.t) == -1, "a world out of range: nothing");
}

int main(void) {
    RUN_TEST(test_silent_members);
    RUN_TEST(test_machines_to_probe);
    RUN_TEST(test_probe_members);
    RUN_TEST(test_silent_kind);
    RUN_TEST(test_spares_usable);
    RUN_TEST(test_control_view);
    RUN_TEST(test_control_plane_outage);
    RUN_TEST(test_committed_after_outage);
    RUN_TEST(test_resume_choose);
    RUN_TEST(test_nodes_lost);
    RUN_TEST(test_one_failure);
    RUN_TEST(test_two_failures_one_epoch);
    RUN_TEST(test_failure_during_recovery);
    RUN_TEST(test_holder_lost_too);
    RUN_TEST(test_holder_lost_one_alive);
    RUN_TEST(test_stateless_ranks);
    RUN_TEST(test_no_spare);
    RUN_TEST(test_fewer_spares_than_failures);
    RUN_TEST(test_comm_failure_rebuild);
    RUN_TEST(test_ft_disk_none);
    RUN_TEST(test_invalid_input);
    RUN_TEST(test_decision_roundtrip_full);
    RUN_TEST(test_decision_parse_valid);
    RUN_TEST(test_decision_parse_truncated);
    RUN_TEST(test_decision_parse_out_of_range);
    RUN_TEST(test_decision_parse_malformed);
    RUN_TEST(test_report_roundtrip);
    RUN_TEST(test_report_parse_refuses);
    TEST_MAIN_END();
}
