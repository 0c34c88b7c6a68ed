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

#include "config.h"

#define RECOVERY_MAX_RANKS DP_MAX_RANKS

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

/* The text form of a decision, one "key=value" line each, every line ending in '\n':
 *   epoch=E  world=W  rollback=G  t_fail_ms=T  t_detect_ms=T  t_decide_ms=T   (once each)
 *   rank=R:PROC                          (once for every R in [0, W))
 *   nfailed=N
 *   failed=R:KIND:OLD_PROC:SPARE_PROC    (N lines; R < W, SPARE_PROC = the owner of R)
 * Written and read only here (decision_publish / decision_read). */
#define DECISION_TEXT_MAX (RECOVERY_MAX_RANKS * 128 + 1024) /* any decision of the limit's size fits */
/* Encodes d into buf. 0, or -1 when buf is too small or d is not a decision decision_parse
 * would accept (world out of [1, RECOVERY_MAX_RANKS], a proc id <= 0, a bad failed entry). */
int decision_format(const Decision *d, char *buf, size_t len);
/* Decodes decision_format's text into d. 0, or -1 with err (may be NULL) saying why: a
 * malformed or unterminated line, an unknown or repeated key, a world out of
 * [1, RECOVERY_MAX_RANKS], a rank out of range or missing, a failed entry for a rank >= world
 * or a count that differs from nfailed. Never a partial decision: on -1, d is zeroed. */
int decision_parse(const char *text, Decision *d, char *err, size_t errlen);

/* Writes the decision, reassigns the failed ranks, moves the epoch counter, then wakes every
 * member. 0 / -1. */
/* fence: the coordinator's lease value (ctl_batch_begin_fenced), NULL on one machine, where
 * only one launcher ever coordinates. */
int decision_publish(ctl_t *c, const Decision *d, const char *fence);
/* Reads the decision of `epoch`. 0 / -1 (absent, or refused by decision_parse: logged). */
int decision_read(ctl_t *c, long epoch, Decision *d);
/* The rank proc_id holds in d, -1 if it is not a member (fenced). */
int decision_rank_of(const Decision *d, long proc_id);
/* 1 if `rank` failed in d (its process is new: a spare). */
int decision_rank_replaced(const Decision *d, int rank);

/* Fencing an epoch: once the coordinator has seen a failure in epoch e it closes e; members
 * check before every optimizer update and stop instead of changing their state, and a
 * rendezvous for e gives up. */
int fence_epoch(ctl_t *c, long epoch);
/* The same, as a command of the batch open on c (ctl_batch_begin). */
void batch_fence_epoch(ctl_t *c, long epoch);
/* 1 if `epoch` is closed, 0 if not. */
int epoch_fenced(ctl_t *c, long epoch);

/* Replica holders of each rank are recorded per epoch so a spare can find a failed rank's
 * state. The list's grammar, written and read only here: HOLDER ("," HOLDER)*, HOLDER :=
 * PROC "@" HOST ":" PORT (PROC the holder's process id). */
typedef struct {
    long proc;
    char host[256];
    int port;
} Holder;
#define HOLDERS_MAX 16          /* --replicas' upper bound */
#define HOLDERS_TEXT_MAX 4400   /* a list of HOLDERS_MAX holders fits */
int holders_record(ctl_t *c, long epoch, int rank, const char *list);
int holders_read(ctl_t *c, long epoch, int rank, char *list, size_t len);
/* 0, or -1 when out is too small. */
int holders_format(const Holder *h, int n, char *out, size_t len);
/* The number of holders parsed (at most max), -1 on a malformed list. */
int holders_parse(const char *list, Holder *out, int max);

/* Reports: what a process tells the coordinator, typed, on a channel of their own (the job's
 * "reports" list, which the coordinating launcher drains). Decisions are made from these,
 * never from event lines; report_send writes the event line of the same record, so the log
 * is a projection of what was reported (a recovery's line carries its timings besides). */
typedef enum {
    REPORT_COMM_FAILURE, /* a collective failed in EPOCH at STEP; TEXT why */
    REPORT_JOIN_FAILED,  /* joining EPOCH failed in PHASE; TEXT why */
    REPORT_RECOVERED,    /* EPOCH's recovery is over (its members trained a step) */
    REPORT_DIVERGED,     /* training diverged at STEP; TEXT says why and how to go on */
    REPORT_JOB_DONE,     /* every rank finished STEP steps */
    REPORT_MODEL_SAVED,  /* the final model is at TEXT (a path) */
    REPORT_LINK_DOWN,    /* an injected network loss cut RANK off (netns) */
    REPORT_KINDS
} report_kind;

typedef enum { JOIN_RENDEZVOUS, JOIN_RESTORE, JOIN_PHASES } join_phase;

typedef struct {
    report_kind kind;
    long epoch;         /* -1: none */
    int rank;           /* -1: none */
    long long step;     /* 1-based; -1: none */
    int64_t t_wall_ms;  /* when it happened, on the job's clock */
    join_phase phase;   /* REPORT_JOIN_FAILED */
    char text[2048];    /* NUL-terminated; may hold any other byte */
} Report;

/* Text form: "KIND EPOCH RANK STEP T_WALL_MS PHASE\n" then TEXT (the rest of the value).
 * KIND and PHASE by name (report_kind_name, join_phase_name). */
#define REPORT_TEXT_MAX (2048 + 160)
const char *report_kind_name(report_kind k);
const char *join_phase_name(join_phase p);
/* 0, or -1 when buf is too small or r is not a report report_parse would accept. */
int report_format(const Report *r, char *buf, size_t len);
/* Decodes n bytes of report_format's text. 0, or -1 with err (may be NULL) saying why (an
 * unknown kind or phase, a number out of range, a missing field, text too long). On -1, r is
 * zeroed. */
int report_parse(const char *text, size_t n, Report *r, char *err, size_t errlen);
/* Pushes r to the reports list and its event line to the events list. 0 / -1. */
int report_send(ctl_t *c, int64_t t0_wall_ms, const Report *r);

#endif
