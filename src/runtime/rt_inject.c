/* rt_inject.c — fault injection: the faults of --inject and --chaos, fired once each mid-step
 * (SET NX in Redis, so a step re-run after a rollback does not fire them again), and rkill,
 * which fires while a process recovers into an epoch (epoch 0: as the job starts). */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "runtime_internal.h"

#include "events.h"
#include "netns.h"
#include "protocol.h"
#include "rng.h"
#include "util.h"

static void fire_fault(dp_t *dp, fault_kind kind, long long step) {
    const char *name = fault_kind_name(kind == FAULT_RKILL ? FAULT_KILL : kind);
    FaultRecord fr = {.rank = dp->rank, .wall_ms = wall_ms()};
    snprintf(fr.kind, sizeof fr.kind, "%s", name);
    ctl_fault_last_set(dp->ctl, &fr); /* the failure time, for total_ms */
    event_emit(dp->ctl, dp->t0_wall_ms, "fault_injected", "\"kind\":\"%s\",\"rank\":%d,\"step\":%lld,\"pid\":%d", name,
               dp->rank, step + 1, (int)getpid());
    if (kind == FAULT_RKILL) log_msg("injecting %s while joining epoch %ld", name, dp->epoch);
    else log_msg("injecting %s at step %lld", name, step + 1);
    if (kind == FAULT_KILL || kind == FAULT_RKILL) raise(SIGKILL);
    else if (kind == FAULT_STOP) raise(SIGSTOP);
    else if (kind == FAULT_NETDOWN) {
        Report r = {.kind = REPORT_LINK_DOWN, .epoch = dp->epoch, .rank = dp->rank, .step = step + 1, .t_wall_ms = wall_ms()};
        report_send(dp->ctl, dp->t0_wall_ms, &r); /* before the link is gone */
        netns_cut_own_link();
    }
}

/* Faults from --inject and --chaos fire once each, even when the step is re-run after a
 * rollback (SET NX in Redis). They fire mid-step, after the forward/backward: where a real
 * failure most likely strikes. */
void rt_maybe_inject(dp_t *dp, int64_t step) {
    for (int i = 0; i < dp->nfaults; i++) {
        const FaultSpec *f = &dp->faults[i];
        if (f->kind == FAULT_CORRUPT) {
            /* Every process may hold the rank's replicas: each damages its own copies, once,
             * a step early: a holder reaches mid-step STEP-1 before the rank can reach STEP
             * (the step's collectives are between), while at STEP itself a rank killed there
             * can be restored before a slower holder got to its damage. */
            int64_t arm = f->at > 1 ? f->at - 1 : 1;
            if (arm == step + 1 && ctl_fault_claim(dp->ctl, i, dp->proc_id) == 1) {
                replica_server_corrupt_rank(dp->replicas, f->rank);
                event_emit(dp->ctl, dp->t0_wall_ms, "fault_injected", "\"kind\":\"corrupt\",\"rank\":%d,\"holder\":%ld,"
                           "\"step\":%lld", f->rank, dp->proc_id, (long long)step + 1);
            }
        } else if (f->kind != FAULT_RKILL && f->rank == dp->rank && f->at == step + 1 &&
                   ctl_fault_claim(dp->ctl, i, 0) == 1) {
            fire_fault(dp, f->kind, step);
        }
    }
    if (dp->cfg.chaos > 0.0f) {
        uint64_t h = rng_hash4(dp->cfg.seed, (uint64_t)step, 0xC4A05ULL, 0);
        double u = (double)(h >> 11) / 9007199254740992.0;
        if (u < dp->cfg.chaos && (int)((h >> 3) % (uint64_t)dp->cfg.workers) == dp->rank && step > 0 &&
            ctl_chaos_claim(dp->ctl, step) == 1)
            fire_fault(dp, (h >> 40) & 1 ? FAULT_STOP : FAULT_KILL, step);
    }
}

/* rkill: the process taking RANK dies while it recovers into EPOCH. */
void rt_maybe_inject_in_recovery(dp_t *dp) {
    for (int i = 0; i < dp->nfaults; i++) {
        const FaultSpec *f = &dp->faults[i];
        if (f->kind == FAULT_RKILL && f->rank == dp->rank && f->at == dp->epoch &&
            ctl_fault_claim(dp->ctl, i, 0) == 1)
            fire_fault(dp, FAULT_RKILL, -1);
    }
}
