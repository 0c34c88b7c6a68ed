/* coordinator.h — failure detection and the one decision per epoch (runs in the launcher).
 *
 * It watches the members of the current epoch (local child exits, exits other machines'
 * launchers report, heartbeat keys, whole machines whose launcher fell silent, reported
 * communication failures confirmed by a probe of the peers), and when members fail it decides the next epoch: a live spare for
 * each failed rank and the rollback generation (the newest committed by every rank). Its
 * state is the job's Redis keys (epoch, decisions, committed generations, spare pool), so a
 * restarted coordinator would find everything it needs there. When no spare is left it
 * persists the newest committed generation and waits --spare-wait seconds for one.
 *
 * The decision itself is decide_next (decide.h), a pure function: the coordinator gathers its
 * inputs (members, pending failures, committed generations, live spares, replica holders)
 * from its state and Redis, and acts on the outcome (publish, persist, report). */
#ifndef DEADPOOL_COORDINATOR_H
#define DEADPOOL_COORDINATOR_H

#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "control.h"

typedef struct Coordinator Coordinator;

typedef enum { COORD_RUNNING = 0, COORD_FAILED = 1 } coord_state;

/* node: the id of the machine the coordinator runs on (its members there are its children). */
Coordinator *coord_create(ctl_t *ctl, const JobConfig *cfg, int64_t t0_wall_ms, const char *node);
void coord_free(Coordinator *c);
/* Across machines: decisions are published under the coordinator's lease (control.h). */
void coord_set_fence(Coordinator *c, const char *lease);
/* Another launcher coordinated until now: picks the job's state up from Redis. 0 / -1. */
int coord_take_over(Coordinator *c);

/* A local child process exited (waitpid status). */
void coord_child_exited(Coordinator *c, pid_t pid, int status);
/* A member reported a failed collective in `epoch`, at wall time t_wall_ms. */
void coord_comm_failure(Coordinator *c, long epoch, int64_t t_wall_ms);
/* A process failed to join `epoch` as `rank`; restore_failed: no verified copy of the rank's
 * state was reachable (the job then stops with a message), else the rendezvous failed (a
 * member died, and its failure makes the next decision; or it timed out, and the epoch is
 * rebuilt with the same members, as after a failed collective). */
void coord_join_failed(Coordinator *c, long epoch, int rank, int restore_failed, const char *why);
/* The newest step the job completed (from the metrics). */
void coord_progress(Coordinator *c, int step);

/* Periodic work: liveness checks and decisions. *spares_used counts spares consumed or lost
 * since the last call (the launcher may start replacements: the pool stays at --spares). */
coord_state coord_tick(Coordinator *c, int *spares_used);
/* Spares to start at once (one machine, --respawn-spares): failed ranks that found no spare.
 * Returned once; 0 when none are wanted. */
int coord_spares_wanted(Coordinator *c);
/* 1 when process `proc`, started as a spare, may still be on its way into the pool: it is
 * not a member of the current epoch, not in the pool the last decision's inputs saw, and was
 * never dropped from the pool as lost (a spare stopped or hung is not coming). */
int coord_spare_arriving(const Coordinator *c, long proc);
/* How soon coord_tick wants to run again, in ms: short while a failure is being handled,
 * otherwise when the next liveness check is due. */
int coord_tick_due_ms(const Coordinator *c);
/* Why the job cannot continue (after COORD_FAILED). */
const char *coord_message(const Coordinator *c);
/* The job is being stopped (Ctrl-C, SIGTERM): asks every member to write the newest generation
 * all of them committed to disk (the no-spare fallback's request) and closes the epoch so that
 * they leave their step and answer it. That generation, -1 if none was committed. */
long long coord_persist_on_stop(Coordinator *c);
/* 1 when generation g is whole on disk: a complete checkpoint in --out (one machine), the
 * persist record every rank wrote its part (across machines). How long a stop waits for that
 * (after --spare-wait when no spare came; after Ctrl-C): COORD_PERSIST_WAIT_MS. */
int coord_persisted(Coordinator *c, long long g);
#define COORD_PERSIST_WAIT_MS 30000
long coord_epoch(const Coordinator *c);
/* The control plane's outages: 1 when it answers and its last outage ended a detect timeout
 * ago (silence is judged, decisions are taken), else 0. */
int coord_control_settled(const Coordinator *c);
/* 1 when pid is a member of the current epoch on this machine (not a spare). */
int coord_is_member(const Coordinator *c, pid_t pid);
/* The first failure the coordinator could not hot-swap (for the --ft disk restart path):
 * its rank, kind and wall-clock time. -1 if none. */
int coord_unhandled_failure(const Coordinator *c, char *kind, size_t len, int64_t *t_fail_ms);

#endif
