/* decide.c — the coordinator's decision: inputs in, outcome and decision out, nothing else. */
#include "decide.h"

#include "protocol.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *decide_outcome_name(decide_outcome o) {
    switch (o) {
    case DECIDE_WAIT: return "wait";
    case DECIDE_SWAP: return "swap";
    case DECIDE_REBUILD: return "rebuild";
    case DECIDE_NO_SPARE: return "no_spare";
    case DECIDE_STATE_LOST: return "state_lost";
    case DECIDE_NO_FT: return "no_ft";
    case DECIDE_GIVE_UP: return "give_up";
    case DECIDE_INVALID: return "invalid";
    }
    return "?";
}

static int compare_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* NULL if the input is consistent, else what is wrong with it. */
static const char *check_input(const DecideInput *in, char *buf, size_t len) {
    if (in->world < 1 || in->world > DP_MAX_RANKS) {
        snprintf(buf, len, "decide: world %d out of [1, %d]", in->world, DP_MAX_RANKS);
        return buf;
    }
    if (in->nfailed < 0 || in->nfailed > in->world) {
        snprintf(buf, len, "decide: %d failures for a world of %d", in->nfailed, in->world);
        return buf;
    }
    if (in->nspares < 0 || in->nspares > DP_MAX_RANKS) {
        snprintf(buf, len, "decide: %d spares out of [0, %d]", in->nspares, DP_MAX_RANKS);
        return buf;
    }
    for (int i = 0; i < in->nfailed; i++) {
        const DecideFailure *f = &in->failed[i];
        if (f->rank < 0 || f->rank >= in->world) {
            snprintf(buf, len, "decide: failed rank %d out of [0, %d)", f->rank, in->world);
            return buf;
        }
        if (f->nholders < 0 || f->nholders > HOLDERS_MAX) {
            snprintf(buf, len, "decide: rank %d has %d holders, out of [0, %d]", f->rank, f->nholders, HOLDERS_MAX);
            return buf;
        }
        for (int j = 0; j < i; j++)
            if (in->failed[j].rank == f->rank) {
                snprintf(buf, len, "decide: rank %d failed twice", f->rank);
                return buf;
            }
    }
    return NULL;
}

/* 1 if a holder of failure i's replicas is alive and is not a failed member itself. */
static int replica_survives(const DecideInput *in, const DecideFailure *f) {
    for (int h = 0; h < f->nholders; h++) {
        long proc = f->holder_proc[h];
        int dead = !f->holder_alive[h];
        for (int i = 0; i < in->nfailed && !dead; i++)
            if (in->procs[in->failed[i].rank] == proc) dead = 1;
        if (!dead) return 1;
    }
    return 0;
}

/* The decision's draft: the next epoch, the rollback, and each failed rank given the next
 * spare (ascending proc ids, the failures in the order seen). The number of spares. */
static int decision_draft(const DecideInput *in, Decision *out) {
    memset(out, 0, sizeof *out);
    out->epoch = in->epoch + 1;
    out->world = in->world;
    out->rollback = in->committed_min > in->restore_point ? in->committed_min : in->restore_point;
    memcpy(out->procs, in->procs, sizeof(long) * (size_t)in->world);
    out->t_fail_ms = in->nfailed ? in->failed[0].t_fail_ms : in->now_wall_ms;
    out->t_detect_ms = in->nfailed ? in->failed[0].t_detect_ms : in->now_wall_ms;
    out->t_decide_ms = in->now_wall_ms;

    /* Spares in ascending proc-id order: the failures, in the order seen, take them in turn. */
    long spares[DP_MAX_RANKS];
    int nspares = in->nspares;
    memcpy(spares, in->spares, sizeof(long) * (size_t)nspares);
    qsort(spares, (size_t)nspares, sizeof *spares, compare_long);
    for (int i = 0; i < in->nfailed; i++) {
        const DecideFailure *p = &in->failed[i];
        FailedRank *f = &out->failed[out->nfailed++];
        f->rank = p->rank;
        f->old_proc = in->procs[p->rank];
        f->spare_proc = i < nspares ? spares[i] : 0;
        snprintf(f->kind, sizeof f->kind, "%s", p->kind);
        if (f->spare_proc) out->procs[f->rank] = f->spare_proc;
        if (p->t_fail_ms < out->t_fail_ms) out->t_fail_ms = p->t_fail_ms;
    }
    return nspares;
}

/* DECIDE_STATE_LOST with why when a failed rank's state is gone: every replica holder of it
 * failed too, unless the job restarts from its initial state anyway (nothing committed yet).
 * A rank with no state of its own loses nothing: the state every rank holds identically is in
 * each member's own snapshots, so only when no member survives must rank 0's replica (which
 * carries it) be reachable. Else DECIDE_SWAP. */
static decide_outcome state_lost(const DecideInput *in, const Decision *out, const char *resume, char *why, size_t whylen) {
    int survivors = in->world - in->nfailed;
    for (int i = 0; i < in->nfailed && out->rollback >= 0; i++) {
        const DecideFailure *f = &in->failed[i];
        int stateless = f->stateless_through >= out->rollback;
        if ((stateless && (f->rank != 0 || survivors > 0)) || replica_survives(in, f)) continue;
        char lost[320];
        if (stateless)
            snprintf(lost, sizeof lost, "every rank failed (rank %d: %s) and every holder of rank %d's replicas with "
                     "them, so the state every rank held identically is lost", f->rank, f->kind, f->rank);
        else if (f->holders_refused && f->nholders == 0)
            snprintf(lost, sizeof lost, "rank %d failed (%s) and the record of its replica holders in Redis does not "
                     "verify (written without the job's key), so its %sstate cannot be fetched", f->rank, f->kind,
                     in->checkpoint_step >= 0 ? "in-memory " : "");
        else
            snprintf(lost, sizeof lost, "rank %d failed (%s) together with every holder of its replicas, so its %sstate "
                     "is lost", f->rank, f->kind, in->checkpoint_step >= 0 ? "in-memory " : "");
        if (in->checkpoint_step >= 0)
            set_err(why, whylen, "%s; continue from the checkpoint of step %lld with `%.900s`", lost,
                (long long)in->checkpoint_step + 1, resume);
        else
            set_err(why, whylen, "%s and no checkpoint exists (use --replicas 2 or --persist-every K to survive this)", lost);
        return DECIDE_STATE_LOST;
    }
    return DECIDE_SWAP;
}

decide_outcome decide_next(const DecideInput *in, Decision *out, char *why, size_t whylen) {
    if (why && whylen) why[0] = 0;
    char bad[160];
    if (check_input(in, bad, sizeof bad)) {
        set_err(why, whylen, "%s", bad);
        return DECIDE_INVALID;
    }
    /* Nothing failed: only a failed collective that lasted long enough leads anywhere. */
    if (in->nfailed == 0 && !in->suspicion_due) return DECIDE_WAIT;
    /* The control plane is away or just back: the commit records may be stale, and nothing
     * published now would reach anyone. The failures wait (bounded by --control-wait). */
    if (in->control_unsettled) return DECIDE_WAIT;
    int nspares = decision_draft(in, out);
    /* A failed collective with no failed member: rebuild the communicator, same members,
     * unless that was tried again and again without a step committed in between: the same
     * cause would fail the next one too. */
    if (in->nfailed == 0 && in->fruitless_rebuilds >= DECIDE_MAX_FRUITLESS_REBUILDS && in->committed_min <= in->restore_point) {
        set_err(why, whylen, "the recovery to step %lld failed %d times in a row with no process failing (a collective or "
                "a transfer of the recovery did not complete: the messages above say which); stopping rather than "
                "trying again", out->rollback + 1, in->fruitless_rebuilds);
        return DECIDE_GIVE_UP;
    }
    if (in->nfailed == 0) return DECIDE_REBUILD;

    const DecideFailure *first = &in->failed[0];
    const char *resume = in->resume ? in->resume : "deadpool run --resume OUT";
    if (in->ft != FT_DEADPOOL) {
        set_err(why, whylen, "rank %d failed (%s); --ft %s has no in-memory snapshots to hot-swap from", first->rank,
            first->kind, in->ft == FT_DISK ? "disk" : "none");
        return DECIDE_NO_FT;
    }
    decide_outcome lost = state_lost(in, out, resume, why, whylen);
    if (lost != DECIDE_SWAP) return lost;
    if (nspares < in->nfailed) {
        set_err(why, whylen,
            "rank %d failed (%s) and no spare joined within %d s. Nothing committed is lost: continue with "
            "`%.900s` (checkpoint of step %lld)",
            first->rank, first->kind, in->spare_wait, resume, out->rollback + 1);
        return DECIDE_NO_SPARE;
    }
    return DECIDE_SWAP;
}

int decide_nodes_lost(int world, const int *node, const int *alive, const int *node_alive, int nnodes, int *fail) {
    int marked = 0;
    for (int r = 0; r < world; r++) fail[r] = 0;
    for (int r = 0; r < world; r++) {
        int k = node[r];
        if (alive[r] || k < 0 || k >= nnodes || node_alive[k]) continue;
        for (int q = 0; q < world; q++)
            if (node[q] == k && !fail[q]) { fail[q] = 1; marked++; }
    }
    return marked;
}

/* Every machine's inventory (protocol.h: inventory_parse) into one list of *nall entries (the
 * caller frees it); a refused inventory counts for nothing, and the first refusal goes to bad. */
static InventoryEntry *inventories_parse(const char *const *inventories, int n, int *nall, char *bad, size_t badlen) {
    InventoryEntry *one = malloc(sizeof *one * INVENTORY_ENTRIES_MAX), *all = NULL;
    *nall = 0;
    for (int i = 0; i < n && one; i++) {
        char err[256];
        int k = inventory_parse(inventories[i] ? inventories[i] : "", one, INVENTORY_ENTRIES_MAX, err, sizeof err);
        if (k < 0) {
            if (!bad[0]) snprintf(bad, badlen, "inventory %d of %d refused (%.200s)", i + 1, n, err);
            continue;
        }
        InventoryEntry *grown = k > 0 ? realloc(all, sizeof *all * (size_t)(*nall + k)) : all;
        if (k > 0 && !grown) break;
        all = grown;
        memcpy(all + *nall, one, sizeof *one * (size_t)k);
        *nall += k;
    }
    free(one);
    return all;
}

/* Marks in have[] (world ranks) the ranks of `step` that some entry lists. */
static void inventory_ranks(const InventoryEntry *all, int nall, int64_t step, int world, char *have) {
    memset(have, 0, (size_t)world);
    for (int j = 0; j < nall; j++)
        if (all[j].step == step && all[j].rank < world) have[all[j].rank] = 1;
}

int64_t resume_choose(const char *const *inventories, int n, int world, char *why, size_t whylen) {
    char bad[300] = "";
    int nall;
    InventoryEntry *all = inventories_parse(inventories, n, &nall, bad, sizeof bad);
    char *have = malloc(world > 0 ? (size_t)world : 1);
    int64_t best = -1, newest = -1;
    for (int k = 0; k < nall && have; k++) {
        if (all[k].step > newest) newest = all[k].step;
        if (all[k].step <= best || (k > 0 && all[k].step == all[k - 1].step)) continue;
        inventory_ranks(all, nall, all[k].step, world, have);
        int complete = 1;
        for (int r = 0; r < world && complete; r++) complete = have[r];
        if (complete) best = all[k].step;
    }
    size_t used = 0;
    if (why) why[0] = 0;
    if (why && best < 0 && newest < 0) used = (size_t)snprintf(why, whylen, "no machine has a checkpoint");
    if (why && best < newest && have) {
        inventory_ranks(all, nall, newest, world, have);
        used = (size_t)snprintf(why, whylen, "the checkpoint of step %lld lacks rank(s)", (long long)newest + 1);
        for (int r = 0, shown = 0; r < world && used < whylen && shown < 16; r++)
            if (!have[r]) { used += (size_t)snprintf(why + used, whylen - used, " %d", r); shown++; }
    }
    if (why && bad[0] && used < whylen) snprintf(why + used, whylen - used, "%s%s", used ? "; " : "", bad);
    free(have);
    free(all);
    return best;
}

int decide_control_settled(const DecideControl *c) {
    if (!c->reachable) return 0;
    return c->back_since_ms <= 0 || c->now_ms - c->back_since_ms >= c->detect_timeout_ms;
}

int decide_spares_usable(const long *ids, const int *alive, const char *const *spare_node, int n,
                         const char *const *failed_node, int nfailed, long *out, int max) {
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        int suspect = 0;
        for (int f = 0; f < nfailed && !suspect; f++)
            suspect = spare_node && spare_node[i] && spare_node[i][0] && failed_node[f] && !strcmp(spare_node[i], failed_node[f]);
        if (alive[i] && !suspect) out[k++] = ids[i];
    }
    return k;
}

control_seen decide_control_observe(ControlView *v, int answered, int absent_meanwhile, double now_ms, int detect_timeout_ms) {
    if (!answered) {
        int went = v->reachable;
        if (went) v->unreachable_since_ms = now_ms;
        v->reachable = 0;
        return went ? CONTROL_WENT_AWAY : CONTROL_STILL_AWAY;
    }
    control_seen seen = CONTROL_OK;
    if (!v->reachable || absent_meanwhile) seen = CONTROL_BACK;
    else if (v->last_ok_ms > 0 && now_ms - v->last_ok_ms > detect_timeout_ms / 2) seen = CONTROL_STALE;
    if (seen != CONTROL_OK) {
        v->back_since_ms = now_ms;
        v->reachable = 1;
        v->unreachable_since_ms = 0;
    }
    v->last_ok_ms = now_ms;
    return seen;
}

void decide_control_waited(ControlView *v, double waited_ms) {
    if (v->last_ok_ms > 0 && waited_ms > 0) v->last_ok_ms += waited_ms;
}

long long decide_committed_min(int world, const long long *committed, const int *failed, const long long *held) {
    long long min = -1;
    for (int r = 0; r < world; r++) {
        long long v = committed[r];
        if (failed[r] && held[r] > v) v = held[r];
        if (v < 0) return -1;
        if (r == 0 || v < min) min = v;
    }
    return world > 0 ? min : -1;
}

const char *decide_silent_kind(const char *stat) {
    if (!stat) return "crash";
    const char *paren = strrchr(stat, ')');
    char state = paren && paren[1] == ' ' ? paren[2] : '?';
    if (state == 'T' || state == 't') return "hang";
    if (state == 'Z') return "crash";
    return "network";
}

int decide_probe_whom(int world, const char *departed, const char *pending, int *who) {
    int n = 0;
    for (int r = 0; r < world; r++)
        if (!departed[r] && !pending[r]) who[n++] = r;
    return n;
}

int decide_probe_dead(int world, const int *who, const int *state, int n, const char *departed, const char *pending,
                      int *dead) {
    int count = 0;
    for (int r = 0; r < world; r++) dead[r] = 0;
    for (int i = 0; state && i < n; i++) {
        int r = who[i];
        if (r < 0 || r >= world || state[i] != 0 || departed[r] || pending[r] || dead[r]) continue;
        dead[r] = 1;
        count++;
    }
    return count;
}

int64_t decide_fail_time(int64_t t_fail_ms, int64_t earlier_ms) {
    return earlier_ms > 0 && earlier_ms < t_fail_ms ? earlier_ms : t_fail_ms;
}

int decide_machines_to_probe(int n, const int *index, const char *const *id, const int *present, const char *mine,
                             const char *const *rank_node, int world, char *probed, int nprobed) {
    int marked = 0;
    for (int k = 0; k < n; k++) {
        int idx = index[k];
        if (idx < 0 || idx >= nprobed) continue;
        if (present[k] || !strcmp(id[k], mine)) { probed[idx] = 0; continue; }
        if (probed[idx]) continue;
        int members = 0;
        for (int r = 0; r < world && !members; r++) members = !strcmp(rank_node[r], id[k]);
        if (!members) continue;
        probed[idx] = 1;
        marked++;
    }
    return marked;
}

int decide_silent_members(int world, const int *alive, const char *departed, const char *pending, const ExitRecord *ex,
                          const int *node, const int *node_alive, int nnodes, silent_verdict *verdict, int64_t *t_exit_ms) {
    int eff_alive[DP_MAX_RANKS] = {0}, fail[DP_MAX_RANKS], bad_job = -1;
    if (world < 0 || world > DP_MAX_RANKS) return -1;
    for (int r = 0; r < world; r++) {
        verdict[r] = SILENT_NONE;
        if (t_exit_ms) t_exit_ms[r] = 0;
        eff_alive[r] = alive[r] || departed[r];
        if (alive[r] || departed[r] || pending[r]) continue;
        if (ex[r].how == EXITED_DEPARTED) {
            verdict[r] = SILENT_DEPARTED;
            eff_alive[r] = 1;
        } else if (ex[r].how == EXITED_BAD_JOB) {
            bad_job = r;
        }
    }
    decide_nodes_lost(world, node, eff_alive, node_alive, nnodes, fail);
    for (int r = 0; r < world; r++) {
        if (departed[r] || pending[r] || verdict[r] == SILENT_DEPARTED) continue;
        if (fail[r]) verdict[r] = SILENT_NODE;
        else if (!alive[r]) verdict[r] = ex[r].how == EXITED_CRASH ? SILENT_CRASH : SILENT_PROC;
        else continue;
        if (t_exit_ms && ex[r].how != EXITED_HOWS && ex[r].wall_ms > 0) t_exit_ms[r] = ex[r].wall_ms;
    }
    return bad_job;
}
