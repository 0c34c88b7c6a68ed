/* control.h — the control plane: one Redis namespace per job.
 *
 * Keys live under "dp:{job}:". Each process registers with a unique process id, claims a
 * role (worker rank i, or spare), keeps a heartbeat key alive with a TTL, and reads the
 * epoch counter. Events and metrics are appended to lists that the launcher drains into
 * events.jsonl / metrics.jsonl. A ctl_t is one hiredis connection: not thread-safe; open
 * one per thread. The password is never logged. */
#ifndef DEADPOOL_CONTROL_H
#define DEADPOOL_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h" /* job_state */

typedef struct ctl ctl_t;

#define REDIS_SENTINELS_MAX 8
#define REDIS_UNIX_PATH_MAX 108 /* sizeof sun_path: a unix socket's path is shorter */

typedef struct {
    char host[256];     /* the server (an absolute path: a unix socket, port 0); with sentinels, the first
                         * sentinel (the master is asked for) */
    int port;
    char password[256]; /* "" when none */
    /* Redis Sentinel: the master named `master` is found through these sentinels at every
     * (re)connection, so that a failover is followed (nsentinels = 0: a plain server). */
    char master[128];
    int nsentinels;
    char sentinel_host[REDIS_SENTINELS_MAX][256];
    int sentinel_port[REDIS_SENTINELS_MAX];
} redis_addr;

/* Parses "redis://[:PASSWORD@]HOST:PORT[/]" (or "HOST:PORT"), "unix://[:PASSWORD@]/PATH" (a
 * server on a unix socket: host = PATH, port 0), or
 * "redis-sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER" (at most REDIS_SENTINELS_MAX
 * sentinels; the password is the master's). When the URL carries no password, the
 * environment variable DEADPOOL_REDIS_PASSWORD is used. Returns 0, or -1 with err set. */
int redis_addr_parse(const char *url, redis_addr *out, char *err, size_t errlen);

/* The URL of addr without its password (redis://, unix:// or redis-sentinel://), for a process's
 * environment or a message. */
void redis_addr_format(const redis_addr *a, char *buf, size_t len);

/* Connects and authenticates, each step bounded by timeout_ms. A connection refused, dropped
 * or answered "max number of clients reached" is tried again with backoff within timeout_ms.
 * NULL + err on failure. */
ctl_t *ctl_connect(const redis_addr *addr, const char *job, int timeout_ms, char *err, size_t errlen);
void ctl_close(ctl_t *c);
const char *ctl_job(const ctl_t *c);
const char *ctl_last_error(const ctl_t *c);

/* The fields of the job's two hashes, named by these enums at every call site: their names
 * are spelled beside control_keys.c's key table only (tests/e2e_code.sh checks that no call hands
 * a literal field to ctl_config_* / ctl_proc_*); their values' formats are protocol.h's. */
typedef enum {
    CFG_CONFIG, /* "config": the job's configuration text (job_config_serialize), by the launcher */
    CFG_T0_MS,  /* "t0_ms": the job's start, wall ms (protocol.h: an integer), by the launcher */
    CFG_FIELDS
} ctl_config_field;
typedef enum {
    PROC_REPLICA, /* "replica": its replica server (protocol.h: Endpoint) */
    PROC_HOST,    /* "host": its host name */
    PROC_NODE,    /* "node": its machine's node id */
    PROC_PID,     /* "pid": its pid (protocol.h: an integer) */
    PROC_HELD,    /* "held": the newest generation it holds of each other rank (protocol.h: held_format) */
    PROC_FIELDS
} ctl_proc_field;
/* The field's name in Redis ("?" for none). */
const char *ctl_config_field_name(ctl_config_field f);
const char *ctl_proc_field_name(ctl_proc_field f);

/* The job's key (secret.h: 64 hex characters, from the process's launcher, never from Redis)
 * for the values this connection seals and verifies (protocol.h: proto_seal). Local. 0, or -1
 * for a key that is not one. */
int ctl_set_job_key(ctl_t *c, const char *key_hex);

/* Job configuration: the hash dp:{job}:config (KEY_CONFIG), every field sealed with the job's
 * key (ctl_set_job_key before either call). ctl_config_get verifies it: a field that does not
 * verify is treated like an absent one, and logged. Return 0 / -1 (-1 also when absent, or for
 * a field that is none of ctl_config_field). */
int ctl_config_set(ctl_t *c, ctl_config_field field, const char *value);
int ctl_config_get(ctl_t *c, ctl_config_field field, char *value, size_t len);

/* A fresh process id, unique within the job (INCR dp:{job}:procs). -1 on error. */
long ctl_new_proc_id(ctl_t *c);
/* Claims the process id a launcher drew for one process (DEADPOOL_PROC) for the process pid:
 * the first to claim it keeps it (HSETNX of its PROC_PID field). 1 claimed (also again by the
 * same pid), 0 another process has it (one started by that process, or beside it, inherits
 * the variable: it draws an id of its own instead), -1 error. */
int ctl_proc_claim(ctl_t *c, long proc_id, long pid);
/* Claims worker rank `rank` for proc_id if free (SET NX). 1 claimed, 0 taken, -1 error.
 * Rank owners (this, ctl_set_rank_owner, ctl_batch_rank_owner) and commit records are sealed
 * with the job key (ctl_set_job_key first): one that does not verify reads as none (0, or -1
 * for a commit record), logged. */
int ctl_claim_rank(ctl_t *c, int rank, long proc_id);
/* proc id holding `rank`, 0 if none (or forged), -1 on error (also for a value protocol.h's
 * integer grammar refuses: ctl_last_error names it). Every integer this file reads from Redis
 * (owners, spares, epoch, committed generations, wake-ups) is read with proto_int_parse. */
long ctl_rank_owner(ctl_t *c, int rank);
/* Adds / removes proc_id to / from the spare pool (a set). 0 / -1. */
int ctl_spare_add(ctl_t *c, long proc_id);
int ctl_spare_remove(ctl_t *c, long proc_id);
/* Number of processes in the spare pool, -1 on error. */
long ctl_spare_count(ctl_t *c);

/* Sorted proc ids of the spare pool into ids (up to max). Returns the count, -1 on error. */
int ctl_spare_list(ctl_t *c, long *ids, int max);

/* Per-process facts (the hash dp:{job}:proc:{id}, KEY_PROC): its fields are ctl_proc_field's.
 * 0 / -1 (-1 also when absent). */
int ctl_proc_set(ctl_t *c, long proc_id, ctl_proc_field field, const char *value);
int ctl_proc_get(ctl_t *c, long proc_id, ctl_proc_field field, char *value, size_t len);

/* The job's key schema: every key is "dp:{job}:" + one of these suffixes. Their names are
 * spelled in one place only, control_keys.c's key table (tests/e2e_code.sh checks that no other
 * file spells one); their values' formats are protocol.h's (and recovery.h's), and
 * docs/DESIGN.md lists each key's owner and readers. a and b are the numbers a key carries
 * (epoch, rank, step, index, process id), in the order of the comment. */
typedef enum {
    KEY_CONFIG,       /* config — hash: ctl_config_field's fields (the job's configuration text, secret, start) */
    KEY_PROCS,        /* procs — the process-id counter (INCR) */
    KEY_RANK,         /* rank:RANK — the process id owning RANK */
    KEY_SPARES,       /* spares — set of the spare pool's process ids */
    KEY_PROC,         /* proc:PROC — hash: PROC's facts, ctl_proc_field's fields */
    KEY_COMMITTED,    /* eEPOCH:committed:RANK — RANK's newest committed generation in EPOCH */
    KEY_EPOCH,        /* epoch — the membership epoch */
    KEY_NOTICE,       /* notice:PROC — list: wake-ups of PROC (a decision is out: its epoch) */
    KEY_ABORT,        /* abort:PROC — list: PROC abandons the step in flight (the next epoch) */
    KEY_HB,           /* hb:PROC — PROC's heartbeat (a TTL it renews) */
    KEY_STATE,        /* state — the job's state (protocol.h: job_state) */
    KEY_EVENTS,       /* events — list: event lines, drained into events.jsonl */
    KEY_METRICS,      /* metrics — list: metric lines, drained into metrics.jsonl */
    KEY_REPORTS,      /* reports — list: typed reports for the coordinator (recovery.h) */
    KEY_DECISION,     /* decision:EPOCH — the coordinator's decision text (recovery.h) */
    KEY_HOLDERS,      /* eEPOCH:holders:RANK — replica holders of RANK (holders.h) */
    KEY_FENCED,       /* eEPOCH:fenced — the epoch is closed */
    KEY_GLOO,         /* eEPOCH:gloo — prefix of the epoch's collective rendezvous */
    KEY_APP,          /* eEPOCH:app: — prefix left to an application's own collectives */
    KEY_TIMING,       /* eEPOCH:timing:RANK — RANK's join of EPOCH (protocol.h: JoinTiming) */
    KEY_INJECTED,     /* injected:INDEX:PROC — that --inject fault fired (PROC 0: once per job) */
    KEY_CHAOS,        /* chaos:STEP — a --chaos fault fired at that step */
    KEY_FAULT_LAST,   /* fault:last:RANK — RANK's newest injected fault (protocol.h: FaultRecord) */
    KEY_LAST_STEP,    /* last_step — newest step done when the coordinator decided */
    KEY_PERSIST_REQ,  /* persist:req — no spare left: persist (protocol.h: PersistRequest) */
    KEY_PERSISTED,    /* persisted:STEP — set of ranks whose state of STEP is on disk */
    KEY_JOIN_STATS,   /* eEPOCH:join:RANK — RANK's rendezvous in EPOCH (protocol.h: JoinStats) */
    KEY_LAUNCHER,     /* launcher — the job's launcher (protocol.h: LauncherId), with a TTL it keeps renewing */
    KEY_LAUNCHER_SEEN,/* launcher:seen — wall ms of the launcher's newest renewal (no TTL) */
    KEY_NODES,        /* nodes — hash: node id -> its index (the order machines joined in) */
    KEY_NODE_COUNT,   /* nodes:n — machines that joined (INCR draws the next index) */
    KEY_NODE_ALIVE,   /* node:INDEX:alive — that machine's launcher is alive (a TTL it renews) */
    KEY_EXIT,         /* exit:PROC — how and when PROC ended, by its machine's launcher (protocol.h: ExitRecord) */
    KEY_PROGRESS,     /* metrics:last — the newest step's metrics line (every machine prints it) */
    KEY_COORD,        /* coordinator — the coordinator's lease (protocol.h: LeaseValue; a TTL its holder renews) */
    KEY_COORD_TOKEN,  /* coordinator:token — the lease's fencing token, +1 at every new holder */
    KEY_PERSIST_COMPLETE, /* persist:complete — newest step persisted by every rank (machines' disks) */
    KEY_INVENTORY,    /* inventory — hash: machine index -> the checkpoints on its disk (checkpoint_inventory) */
    KEY_RESUME_HOLDER, /* resume:holder:RANK — a launcher serving RANK's resumed state (protocol.h: Endpoint) */
    KEY_STATELESS,    /* stateless:RANK — sealed S: no generation of RANK through step S (since the process
                       * that wrote it started or restored) carried state of its own (DP_SHARDED regions
                       * or extra bytes). ctl_committed_set writes it; absent, forged or short of a
                       * rollback: RANK may have some (ctl_stateless_through) */
    KEY_GEN_BYTES,    /* gen_bytes:RANK — sealed: the largest generation RANK committed, in bytes (what a spare may fetch) */
    KEY_COUNT
} ctl_key;

/* The suffix of key k into buf; returns buf. */
const char *ctl_key_suffix(char *buf, size_t len, ctl_key k, long long a, long long b);
/* The SCAN pattern of every key of kind k in this job (its numbers as '*'): "dp:{job}:hb:*". */
const char *ctl_key_pattern(const ctl_t *c, char *buf, size_t len, ctl_key k);
/* The whole key "dp:{job}:suffix" (for a store prefix handed to another library). */
const char *ctl_key_full(const ctl_t *c, char *buf, size_t len, ctl_key k, long long a, long long b);

/* The launcher's liveness: ctl_launcher_beat sets KEY_LAUNCHER to `who` for ttl_ms (renewed
 * well inside it) and KEY_LAUNCHER_SEEN to the wall time; ctl_launcher_alive says 1 while
 * KEY_LAUNCHER exists, 0 when it expired (the launcher died, or the job ended and its keys
 * were deleted), -1 on error. */
int ctl_launcher_beat(ctl_t *c, const char *who, int ttl_ms);
int ctl_launcher_alive(ctl_t *c);
/* The janitor: deletes the keys of every other job in this Redis whose launcher key has
 * expired, whose launcher was last seen more than grace_ms ago, and which has no live
 * heartbeat either (a launcher killed with -9 leaves its keys behind). A job without a
 * last-seen time is left alone. The number of jobs removed, -1 on error. */
int ctl_orphan_jobs_delete(ctl_t *c, long long grace_ms);
/* This job's keys are those of a dead run: its config is there, but no launcher key, no
 * machine's alive key and no process heartbeat is (all of them expire). 1 dead, 0 no keys or
 * something of it alive, -1 error. *seen_ms: when its launcher was last alive (wall ms, 0 if
 * unknown). */
int ctl_job_dead_run(ctl_t *c, long long *seen_ms);
/* Deletes a dead run's keys (ctl_job_dead_run) so the id starts afresh. Of machines starting
 * together, one deletes (a claim key beside the job's, for ttl_ms): 1 deleted, 0 another
 * machine holds the claim, -1 error. */
int ctl_job_dead_run_delete(ctl_t *c, int ttl_ms);

/* --- machines (multi-node jobs) ------------------------------------------------------
 * A machine joins with its node id: ctl_node_join gives it the next index (1 joined, 0 the
 * id belongs to a machine whose launcher is alive, -1 error); a launcher of a machine whose
 * previous launcher is gone (its KEY_NODE_ALIVE expired) gets that machine's index back. ctl_node_beat keeps KEY_NODE_ALIVE of index alive
 * for ttl_ms. ctl_nodes_read: every joined node's id (ids + i * idlen) and index, up to max;
 * the count, -1 on error. */
int ctl_node_join(ctl_t *c, const char *node_id, int *index);
int ctl_node_beat(ctl_t *c, int index, int ttl_ms);
int ctl_nodes_read(ctl_t *c, char *ids, size_t idlen, int *index, int max);
/* --- the coordinator's lease ----------------------------------------------------------
 * One launcher coordinates at a time. ctl_lease_acquire takes KEY_COORD for ttl_ms when nobody
 * holds it, with a fresh fencing token: value gets "holder:TOKEN" and the token is returned
 * (0: held by someone else, -1: error). ctl_lease_renew extends it while value is still the
 * lease's: 1 renewed, 0 lost (expired, or another launcher holds it), -1 error.
 * ctl_batch_begin_fenced starts an atomic batch that runs only while KEY_COORD is still value
 * (WATCH): -1 at once when it is not (nothing is sent), else its ctl_batch_end fails when the
 * lease changed hands before EXEC. A coordinator that was stopped and wakes up so cannot
 * publish a decision over its successor's. */
long long ctl_lease_acquire(ctl_t *c, const char *holder, int ttl_ms, char *value, size_t len);
int ctl_lease_renew(ctl_t *c, const char *value, int ttl_ms);
int ctl_batch_begin_fenced(ctl_t *c, const char *value);

/* A job hash dp:{job}:{suffix}: HSET, and HGETALL into fields + i * flen and values + i *
 * vlen (pairs that do not fit are skipped); the count, -1 on error. */
int ctl_hash_set(ctl_t *c, const char *suffix, const char *field, const char *value);
int ctl_hash_getall(ctl_t *c, const char *suffix, char *fields, size_t flen, char *values, size_t vlen, int max);
/* A launcher saw its process `proc` end: records how (KEY_EXIT) and deletes its heartbeat,
 * in one round trip, so that the coordinator on another machine knows within a liveness
 * period. 0 / -1. */
int ctl_exit_report(ctl_t *c, long proc, const ExitRecord *how);
/* Redis's clock minus this machine's realtime clock, in ms, from the TIME round trip with the
 * least delay of a few (error: half that round trip). 0 / -1. */
int ctl_clock_offset(ctl_t *c, int64_t *offset_ms);
/* The server this connection talks to now (with sentinels: the master found last). 0 / -1. */
int ctl_server(ctl_t *c, char *host, size_t len, int *port);
/* Waits (up to timeout_ms) until the first sentinel of `a` knows the master's replica(s) and
 * the other sentinels: before that a failover could not happen. 0 / -1 + err. */
int sentinel_wait_ready(const redis_addr *a, int timeout_ms, char *err, size_t errlen);
/* 1 when the connection goes through sentinels (writes can be lost in a failover unless
 * acknowledged by a replica: ctl_wait_replica), else 0. */
int ctl_replicated(const ctl_t *c);
/* With sentinels: waits (up to timeout_ms) until a replica has every write this connection
 * made, so that what recovery depends on survives a failover (decisions, fences, committed
 * generations). 0 acknowledged or no sentinels, -1 not acknowledged in time (the write stands
 * on the master alone). The wait is at most half the connection's timeout (ctl_set_timeout). */
int ctl_wait_replica(ctl_t *c, int timeout_ms);
/* The local address of this connection (the interface that reaches Redis: what peers on
 * other machines can reach us at, when nothing better is given). 0 / -1. */
int ctl_local_addr(ctl_t *c, char *buf, size_t len);

/* Adds rank to KEY_PERSISTED of step (sealed), atomically: how many ranks the set holds
 * after, counting only members that verify; 0 when rank was in it already, -1 on error. The
 * caller that sees every rank finishes the checkpoint. */
long long ctl_persisted_add(ctl_t *c, long long step, int rank);
/* KEY_PERSIST_COMPLETE, sealed: the newest step persisted by every rank on its machine's disk;
 * ctl_persist_complete: -1 when none (absent, forged: logged, or an error). A forged one would
 * prune real checkpoints and name one that is not there. */
int ctl_persist_complete_set(ctl_t *c, long long step);
long long ctl_persist_complete(ctl_t *c);

/* Newest committed snapshot generation of each rank in an epoch (dp:{job}:e{epoch}:committed:{rank}),
 * with, when stateless_through >= 0, the rank's claim that none of its generations through
 * that step carried state of its own (KEY_STATELESS), written in the same MSET so that whoever
 * counts the step as committed can see the claim. Both sealed. 0 / -1. */
int ctl_committed_set(ctl_t *c, long epoch, int rank, long long step, long long stateless_through);
/* The step S of rank's verified KEY_STATELESS claim: the rank had nothing of its own in any
 * generation through S. -1 when there is none (absent, forged: logged, or Redis unreachable),
 * so a reader treats the rank as having state of its own unless S covers the generation it
 * restores. The claim is a fact about the past that stays true: an old one replayed into
 * Redis covers only generations it was true for. Deleting it can only cost a fetch. */
long long ctl_stateless_through(ctl_t *c, int rank);
/* The same for ranks[0..n) into through[] in one MGET per 256 (-1 each when none): 0 / -1. */
int ctl_stateless_through_many(ctl_t *c, const int *ranks, int n, long long *through);
/* KEY_GEN_BYTES: rank's largest committed generation, sealed (0 / -1); the largest verified
 * value over ranks 0..world-1, 0 when none (or on an error). */
int ctl_gen_bytes_set(ctl_t *c, int rank, long long bytes);
long long ctl_gen_bytes_max(ctl_t *c, int world);
/* Minimum over ranks 0..nranks-1; -1 when some rank has committed nothing; -2 on error. */
long long ctl_committed_min(ctl_t *c, long epoch, int nranks);

/* INCR of the job counter dp:{job}:{name}; the new value, -1 on error. */
long long ctl_counter_incr(ctl_t *c, const char *name);

/* Plain job keys dp:{job}:{suffix}: SET / GET / SET NX (1 set, 0 existed, -1 error). */
int ctl_set(ctl_t *c, const char *suffix, const char *value);
int ctl_get(ctl_t *c, const char *suffix, char *value, size_t len);
int ctl_set_nx(ctl_t *c, const char *suffix, const char *value);
/* The same, sealed with the job key under the suffix (ctl_config_set's way): what decides
 * what the job computes or whom it trusts (a decision, holder lists, a resumed state's
 * server). ctl_get_sealed refuses, and logs, a value that does not verify, as if absent. */
int ctl_set_sealed(ctl_t *c, const char *suffix, const char *value);
int ctl_get_sealed(ctl_t *c, const char *suffix, char *value, size_t len);
/* GET and delete in one step (GETDEL): a record meant to be used once. 0 / -1 (also absent). */
int ctl_take(ctl_t *c, const char *suffix, char *value, size_t len);
/* Reassigns rank to proc_id (the coordinator's hot-swap; plain SET). 0 / -1. */
int ctl_set_rank_owner(ctl_t *c, int rank, long proc_id);
/* Sets the epoch counter (the coordinator publishes a decision). 0 / -1. */
int ctl_epoch_set(ctl_t *c, long epoch);

/* Wake-ups: the coordinator pushes a value to one of a process's lists (KEY_NOTICE: a decision
 * is out; KEY_ABORT: abandon the step in flight); the process waits on it with BLPOP.
 * The value is an epoch (KEY_NOTICE: -1 also, the coordinator's persist request); ctl_wait_notice
 * returns it, 0 on timeout, -1 on error (also for a list that is neither, or a value that is
 * not an integer in [-1, LONG_MAX]: ctl_last_error names it). */
int ctl_notify(ctl_t *c, long proc_id, ctl_key list, long value);
long ctl_wait_notice(ctl_t *c, long proc_id, ctl_key list, int timeout_ms);

/* --- bulk access: one round trip whatever the count ---------------------------------------
 * What a recovery does per rank (owners, process facts, wake-ups, timings) costs one round
 * trip for all ranks, not one per rank: MGET, or commands pipelined on the connection. */

/* procs[r] = the owner of rank r for r in [0, nranks), 0 when unclaimed (MGET). 0 / -1. */
int ctl_rank_owners(ctl_t *c, int nranks, long *procs);
/* Fields of many processes' hashes in one pipeline of HMGETs: the value of fields[f] of
 * procs[i] goes to values + (i * nfields + f) * len, "" when absent or longer than len - 1.
 * 0 / -1. */
int ctl_proc_get_many(ctl_t *c, const long *procs, int n, const ctl_proc_field *fields, int nfields, char *values,
                      size_t len);
/* Plain job keys dp:{job}:{suffixes[i]} (MGET): values + i * len, "" when absent (present[i]
 * = 0; present may be NULL). 0 / -1. */
int ctl_get_many(ctl_t *c, const char *const *suffixes, int n, char *values, size_t len, int *present);
/* ctl_notify for n processes, pipelined. 0 / -1 (-1 if any push failed). */
int ctl_notify_many(ctl_t *c, const long *procs, int n, ctl_key list, long value);

/* A pipeline: the commands appended between ctl_batch_begin and ctl_batch_end go out together
 * and their replies are read by ctl_batch_end: one round trip. Redis runs them in order, so
 * e.g. a decision written before the epoch counter moves is seen first by every reader.
 * Nothing else may use the connection in between. ctl_batch_end: 0 when every command
 * succeeded, else -1 with the first error (every reply is read either way). */
int ctl_batch_begin(ctl_t *c);
/* The same as one transaction (MULTI ... EXEC): no other client sees it half done, and a
 * command Redis refuses while queueing (out of memory, say) makes it run nothing; a command
 * that fails while running (a wrong type) does not undo the others, and ctl_batch_end says -1. */
int ctl_batch_begin_atomic(ctl_t *c);
void ctl_batch_set(ctl_t *c, const char *suffix, const char *value);
void ctl_batch_set_sealed(ctl_t *c, const char *suffix, const char *value);
void ctl_batch_rank_owner(ctl_t *c, int rank, long proc_id);
void ctl_batch_epoch(ctl_t *c, long epoch);
void ctl_batch_notify(ctl_t *c, long proc_id, ctl_key list, long value);
void ctl_batch_spare_remove(ctl_t *c, long proc_id);
/* RPUSH value onto the list named by a whole key (ctl_key_full), which expires in ttl_s. */
void ctl_batch_push_key(ctl_t *c, const char *key, const char *value, int ttl_s);
int ctl_batch_end(ctl_t *c);

/* Round trips this connection has made since ctl_connect: each command, MGET or pipeline
 * sent and waited for counts once (reconnecting does not count). ctl_mark remembers the
 * count; ctl_round_trips_since_mark is the count since (since ctl_connect before any mark). */
unsigned long long ctl_round_trips(const ctl_t *c);
void ctl_mark(ctl_t *c);
unsigned long long ctl_round_trips_since_mark(const ctl_t *c);

/* alive[i] = heartbeat of procs[i] present (1) or expired (0), one round trip. 0 / -1. */
int ctl_alive_many(ctl_t *c, const long *procs, int n, int *alive);

/* CONFIG SET on the server (e.g. "bind"): 0 / -1. */
int ctl_server_config_set(ctl_t *c, const char *param, const char *value);

/* Heartbeat: SET dp:{job}:hb:{proc_id} PX ttl_ms. 0 / -1. */
int ctl_heartbeat(ctl_t *c, long proc_id, int ttl_ms);
/* Deletes the heartbeat of a process known to have exited: it is dead for every reader at
 * once, not only once its key expires. 0 / -1. */
int ctl_heartbeat_clear(ctl_t *c, long proc_id);
/* 1 if the heartbeat key of proc_id is alive, 0 if expired, -1 on error. */
int ctl_alive(ctl_t *c, long proc_id);

/* Membership epoch: the current value (0 before the first increment) and INCR. -1 on error. */
long ctl_epoch(ctl_t *c);
long ctl_epoch_incr(ctl_t *c);

/* The job's state (dp:{job}:state), protocol.h's job_state. ctl_state_set: 0 / -1 (a value
 * out of range is refused). ctl_state_get: 1 read into *state; 0 absent (not published yet,
 * or the job's keys are gone); -1 the control plane not reached, or a value that is no
 * job_state (c's error names it). *state is written only when 1 is returned. */
int ctl_state_set(ctl_t *c, job_state state);
int ctl_state_get(ctl_t *c, job_state *state);

/* Appends one JSON line to the job's event / metric list. 0 / -1. */
int ctl_push_event(ctl_t *c, const char *json);
int ctl_push_metric(ctl_t *c, const char *json);
/* A typed report (recovery.h: report_format's text) for the coordinator, sealed with the job
 * key (a forged "job done" or "model saved" would end the job or name another file). */
int ctl_push_report(ctl_t *c, const char *text);
/* Pops up to max items from the list (KEY_EVENTS, KEY_METRICS or KEY_REPORTS) in order,
 * calling fn for each; a report that does not verify is skipped, and logged. Returns the
 * number popped, -1 on error (also for another key). Events and metrics are telemetry, not
 * sealed. */
int ctl_drain(ctl_t *c, ctl_key list, int max, void (*fn)(const char *json, void *arg), void *arg);

/* Deletes every key of the job (used by the launcher at the end). 0 / -1. */
int ctl_job_delete(ctl_t *c);

/* --- a redis URL with its password, in a file (never on a command line) ----------------
 * redis_file_write: addr as a URL with its password (percent-encoded) into dir/redis, 0600,
 * the path into path; 0 / -1 + err. redis_file_read: the one-line URL of such a file; the
 * file must be a regular file (no link followed) owned by this user and neither readable nor
 * writable by anybody else (chmod 600); 0 / -1 + err naming the problem. */
#define DP_ENV_REDIS_FILE "DEADPOOL_REDIS_FILE" /* the launcher's redis file (for the spare hint) */
#define DP_ENV_SECRET_FILE "DEADPOOL_SECRET_FILE" /* the secret a launcher drew, in a 0600 file (the same) */
int redis_file_write(const redis_addr *addr, const char *dir, char *path, size_t len, char *err, size_t errlen);
int redis_file_read(const char *path, char *url, size_t len, char *err, size_t errlen);
/* Overwrites, in place, the password of a redis URL (":PASSWORD@") with '*': for argv, so that
 * /proc/PID/cmdline stops showing it. 1 when there was one, else 0. */
int redis_url_scrub(char *url);

/* --- outages (issue 27, items 11 and 12) ------------------------------------------------
 * ctl_error_transient: 1 when the last failed call failed because the server did not answer
 * (connection refused or reset, end of stream, its timeout: hiredis's REDIS_ERR_IO / EOF /
 * TIMEOUT, or a server that answered LOADING, READONLY or MASTERDOWN), 0 when it answered with
 * an error of its own (a wrong type, a refused command): retrying the first may work, the
 * second will not. Classified by hiredis's error code, never by the message's text.
 * ctl_set_timeout changes the command timeout of the connection (and of its reconnections);
 * ctl_timeout says the current one. ctl_committed_get_many: each rank's committed generation
 * in epoch (-1 when none), one MGET per 256 ranks; 0 / -1. ctl_counter_at_least raises the
 * job counter dp:{job}:{name} to value if it is lower (a Redis that restarted empty must not
 * hand out process ids again); 0 / -1. */
int ctl_error_transient(const ctl_t *c);
/* 1 when the last sealed read (ctl_get_sealed, ctl_config_get) found a value that did not
 * verify: written by someone without the job key. Local. */
int ctl_value_refused(const ctl_t *c);
/* The same for this thread's last ctl_connect that returned NULL. */
int ctl_connect_error_transient(void);
/* How many calls on c failed so far for the server's absence: a caller that sees it grow knows
 * the control plane was away (or restarted, empty) even when its own calls all answered. */
unsigned long ctl_absences(const ctl_t *c);
void ctl_set_timeout(ctl_t *c, int timeout_ms);
int ctl_timeout(const ctl_t *c);
int ctl_committed_get_many(ctl_t *c, long epoch, int nranks, long long *steps);
int ctl_counter_at_least(ctl_t *c, const char *name, long long value);


/* --- records with a codec of their own (control_records.c): one accessor pair per key ------
 * Setters 0 / -1; getters as each says. None of them is sealed: what forging each can do is
 * in docs/RELIABILITY.md (delay or stop a job, never change its model). */
/* KEY_FAULT_LAST: when rank f->rank's newest injected fault fired (the failure time a recovery
 * measures from). _take reads and deletes it: 1 found (for that rank), 0 none or malformed
 * (logged). */
int ctl_fault_last_set(ctl_t *c, const FaultRecord *f);
int ctl_fault_last_take(ctl_t *c, int rank, FaultRecord *f);
/* KEY_INJECTED / KEY_CHAOS: the fault `index` (for process proc; 0: once per job) or the chaos
 * fault of `step` fires once: 1 this caller is the first, 0 it fired already, -1 error. */
int ctl_fault_claim(ctl_t *c, int index, long proc);
int ctl_chaos_claim(ctl_t *c, long long step);
/* KEY_TIMING, KEY_JOIN_STATS: rank's join of epoch. ctl_joins_get reads every rank's two records
 * and KEY_LAST_STEP in one MGET: has_t[r] / has_s[r] 0 where a rank wrote none (or a malformed
 * one, logged); *last -1 when unknown. 0 / -1 (then nothing is known). */
int ctl_join_timing_set(ctl_t *c, long epoch, int rank, const JoinTiming *t);
int ctl_join_stats_set(ctl_t *c, long epoch, int rank, const JoinStats *s);
int ctl_joins_get(ctl_t *c, long epoch, int world, JoinTiming *t, int *has_t, JoinStats *s, int *has_s, long long *last);
/* KEY_LAST_STEP: the newest step done when the coordinator decided. 0 / -1 (none, malformed). */
int ctl_last_step_get(ctl_t *c, long long *step);
void ctl_batch_last_step(ctl_t *c, long long step);
/* KEY_PERSIST_REQ: no spare left, persist. _set: 0, -1 Redis, -2 the request does not format;
 * _get: 1 read, 0 none, -1 malformed (err). */
int ctl_persist_request_set(ctl_t *c, const PersistRequest *p);
int ctl_persist_request_get(ctl_t *c, PersistRequest *p, char *err, size_t errlen);
/* KEY_EXIT: how each of procs[0..n) ended (EXITED_HOWS where no record, or a malformed one,
 * logged). One MGET; 0 / -1. */
int ctl_exits_get(ctl_t *c, const long *procs, int n, ExitRecord *ex);
/* KEY_NODE_ALIVE: present[i] 1 while machine index[i]'s launcher is alive. One MGET; 0 / -1. */
int ctl_nodes_alive(ctl_t *c, const int *index, int n, int *present);
/* KEY_INVENTORY: machine's checkpoints (checkpoint_inventory's text). _get: the machines
 * that published one (machines[i], inventories + i * len, up to max): their count, -1 error. */
int ctl_inventory_set(ctl_t *c, int machine, const char *inventory);
int ctl_inventories_get(ctl_t *c, int *machines, char *inventories, size_t len, int max);
/* KEY_RESUME_HOLDER (sealed): the launcher serving rank's resumed state. _get: 1 read, 0 none
 * yet (or forged), -1 malformed (err). */
int ctl_resume_holder_set(ctl_t *c, int rank, const Endpoint *where);
int ctl_resume_holder_get(ctl_t *c, int rank, Endpoint *where, char *err, size_t errlen);
/* KEY_PROGRESS: the newest step's metrics line. 0 / -1. */
int ctl_progress_get(ctl_t *c, char *json, size_t len);
/* KEY_PROCS: the process-id counter (the last id drawn) raised to at least last (never lowered). 0 / -1. */
int ctl_proc_ids_at_least(ctl_t *c, long long last);

#endif
