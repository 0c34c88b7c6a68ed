/* recovery.h — the membership decision every process of an epoch follows.
 *
 * When a worker fails, the coordinator decides once for the new epoch e+1: which ranks
 * failed (and how), which spare takes each failed rank, and the rollback generation g — the
 * newest snapshot generation every rank committed in epoch e. The decision is one Redis value
 * (dp:{job}:decision:{e+1}); it is written before the epoch counter moves, so whoever sees the
 * new epoch can read it. A process that is not among the decision's members is fenced. */
#ifndef DEADPOOL_RECOVERY_H
#define DEADPOOL_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

#include "control.h"

#define RECOVERY_MAX_RANKS 1024

typedef struct {
    int rank;
    long old_proc, spare_proc;
    char kind[16];          /* crash, hang, network, replica (holder lost), unknown */
} FailedRank;

typedef struct {
    long epoch;
    int world;
    long long rollback;     /* 0-based step to restore; -1 = the initial state */
    long procs[RECOVERY_MAX_RANKS]; /* owner process of each rank in this epoch */
    int nfailed;
    FailedRank failed[RECOVERY_MAX_RANKS];
    int64_t t_fail_ms, t_detect_ms, t_decide_ms; /* wall clock */
} Decision;

/* Writes the decision, reassigns the failed ranks, moves the epoch counter, then wakes every
 * member. 0 / -1. */
int decision_publish(ctl_t *c, const Decision *d);
/* Reads the decision of `epoch`. 0 / -1. */
int decision_read(ctl_t *c, long epoch, Decision *d);
/* The rank proc_id holds in d, -1 if it is not a member (fenced). */
int decision_rank_of(const Decision *d, long proc_id);
/* 1 if `rank` failed in d (its process is new: a spare). */
int decision_rank_replaced(const Decision *d, int rank);

/* Fencing an epoch: once the coordinator has seen a failure in epoch e it closes e; members
 * check before every optimizer update and stop instead of changing their state, and a
 * rendezvous for e gives up. */
int fence_epoch(ctl_t *c, long epoch);
/* 1 if `epoch` is closed, 0 if not. */
int epoch_fenced(ctl_t *c, long epoch);

/* Replica holders of each rank are recorded per epoch so a spare can find a failed rank's
 * state: "host:port,host:port". */
int holders_record(ctl_t *c, long epoch, int rank, const char *list);
int holders_read(ctl_t *c, long epoch, int rank, char *list, size_t len);

#endif
