/* protocol.h — the values the control plane keeps in Redis: for each, a typed struct (or a
 * plain integer) and one format/parse pair, used by its writer and its readers alike. The
 * keys themselves are control.h's ctl_key, the hashes' fields its ctl_config_field and
 * ctl_proc_field (their names: control_keys.c's key table); decisions, replica-holder lists and
 * reports are recovery.h's; docs/DESIGN.md ("The control plane's protocol") lists every key
 * with its owner, its readers and its value's format.
 *
 * The contract of every pair, held by tests/test_protocol.c and tests/fuzz/fuzz_protocol.c:
 *  - a parser takes the whole value (NUL-terminated, as Redis hands it over), accepts exactly
 *    the grammar its comment gives, and refuses anything else with -1 and a message in err
 *    (may be NULL) naming the value, the field, what was expected and what was found; on -1
 *    the struct is zeroed. It never reads past the terminating NUL.
 *  - a format function writes only what its parser accepts: -1 (nothing usable in buf) when
 *    the struct holds something the parser would refuse, or when buf is too small.
 *  - what a parser accepts formats again and parses back to the same struct. */
#ifndef DEADPOOL_PROTOCOL_H
#define DEADPOOL_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h" /* DP_MAX_RANKS */

#ifdef __cplusplus
extern "C" {
#endif

/* --- integers -------------------------------------------------------------------------
 * Decimal, an optional '-' then 1 to 19 digits, nothing else (no sign '+', no space), in
 * [lo, hi]. The integer-valued keys: KEY_EPOCH, KEY_PROCS, KEY_RANK (a process id),
 * KEY_COMMITTED, KEY_LAST_STEP, KEY_PERSIST_COMPLETE, KEY_GEN_BYTES, KEY_LAUNCHER_SEEN,
 * KEY_NODE_COUNT, KEY_COORD_TOKEN, the members of KEY_SPARES, the values of KEY_NODES, the
 * wake-ups on KEY_NOTICE and KEY_ABORT, the config field CFG_T0_MS and the process field
 * PROC_PID. `what` names the value in the error ("epoch", "last_step"...). */
int proto_int_format(long long v, char *buf, size_t len);
int proto_int_parse(const char *s, const char *what, long long lo, long long hi, long long *v, char *err, size_t errlen);

/* --- KEY_FAULT_LAST: "KIND:RANK:WALL_MS" ----------------------------------------------
 * The newest fault injected into RANK (written by the runtime as it fires it, taken once by
 * the coordinator: the failure's time for the recovery's total_ms). KIND: 1 to 15 of
 * [a-z_]; RANK in [0, DP_MAX_RANKS); WALL_MS >= 0. */
typedef struct {
    char kind[16];
    int rank;
    int64_t wall_ms;
} FaultRecord;
#define FAULT_RECORD_TEXT_MAX 64
int fault_record_format(const FaultRecord *f, char *buf, size_t len);
int fault_record_parse(const char *s, FaultRecord *f, char *err, size_t errlen);

/* --- KEY_PERSIST_REQ: "EPOCH:STEP:WRITER:R,R,..." --------------------------------------
 * The coordinator found no spare: every member writes its generation STEP (0-based) of EPOCH
 * to disk, and WRITER also the listed failed ranks' (fetched from their holders). EPOCH >= 0,
 * STEP >= 0, WRITER in [-1, DP_MAX_RANKS) (-1: no surviving rank), then 0 to DP_MAX_RANKS
 * distinct ranks in [0, DP_MAX_RANKS) separated by single commas (the list may be empty). */
typedef struct {
    long epoch;
    long long step;
    int writer;
    int nfailed;
    int failed[DP_MAX_RANKS];
} PersistRequest;
#define PERSIST_REQ_TEXT_MAX (64 + 8 * DP_MAX_RANKS)
int persist_request_format(const PersistRequest *p, char *buf, size_t len);
int persist_request_parse(const char *s, PersistRequest *p, char *err, size_t errlen);

/* --- durations ------------------------------------------------------------------------
 * A duration in ms in the two records below: 1 to 12 digits, optionally '.' and 1 to 3
 * digits (as "%.3f" writes it); the format function refuses a negative or non-finite one, or
 * one of 10^12 ms and more. */

/* --- KEY_TIMING: "RESTORE_MS REBUILD_MS RESNAPSHOT_MS RESUMED_WALL_MS WARM" -------------
 * What a rank's join of an epoch cost (written by the rank, read by every member for the
 * `recovered` event). Three durations, RESUMED_WALL_MS >= 0, WARM 0 or 1; single spaces. */
typedef struct {
    double restore_ms, rebuild_ms, resnapshot_ms;
    int64_t resumed_wall_ms;
    int warm; /* the restore found its state in warm (local) buffers */
} JoinTiming;
#define JOIN_TIMING_TEXT_MAX 128
int join_timing_format(const JoinTiming *t, char *buf, size_t len);
int join_timing_parse(const char *s, JoinTiming *t, char *err, size_t errlen);

/* --- KEY_JOIN_STATS: "CTL_RTT STORE_RTT RENDEZVOUS_MS BARRIER_MS WAIT_MS CONNECT_MS ENTERED_WALL_MS
 *     DIALED ACCEPTED"
 * What a rank's rendezvous in an epoch cost (written by the rank, read as KEY_TIMING is). Two
 * round-trip counts >= 0, four durations, ENTERED_WALL_MS >= 0, the data-plane connections it
 * dialed and accepted (0..INT_MAX); single spaces. */
typedef struct {
    long long ctl_round_trips, store_round_trips;
    double rendezvous_ms, barrier_ms, wait_ms, connect_ms;
    int64_t entered_wall_ms;
    long long dialed, accepted;
} JoinStats;
#define JOIN_STATS_TEXT_MAX 192
int join_stats_format(const JoinStats *s, char *buf, size_t len);
int join_stats_parse(const char *text, JoinStats *s, char *err, size_t errlen);

/* --- KEY_EXIT: "HOW:WALL_MS" -------------------------------------------------------------
 * How and when a process ended, by its machine's launcher (read by the coordinator). HOW is
 * crash, departed (it left on its own: done, fenced, output) or bad_job; WALL_MS >= 0. */
typedef enum { EXITED_CRASH, EXITED_DEPARTED, EXITED_BAD_JOB, EXITED_HOWS } exit_how;
typedef struct {
    exit_how how;
    int64_t wall_ms;
} ExitRecord;
#define EXIT_RECORD_TEXT_MAX 48
int exit_record_format(const ExitRecord *e, char *buf, size_t len);
int exit_record_parse(const char *s, ExitRecord *e, char *err, size_t errlen);

/* --- KEY_LAUNCHER: "HOST PID" ------------------------------------------------------------
 * The launcher that keeps the job alive (its presence is what counts; the value is for a
 * person looking at Redis, and tests). HOST: 0 to 255 bytes, no space or control character;
 * PID in [1, INT_MAX]; one space between. */
typedef struct {
    char host[256];
    int pid;
} LauncherId;
#define LAUNCHER_ID_TEXT_MAX 300
int launcher_id_format(const LauncherId *l, char *buf, size_t len);
int launcher_id_parse(const char *s, LauncherId *l, char *err, size_t errlen);

/* --- KEY_COORD: "HOLDER:TOKEN" -------------------------------------------------------------
 * The coordinator's lease: HOLDER 1 to 63 bytes of [A-Za-z0-9_.-] ("machineN"), TOKEN the
 * fencing token >= 1 (KEY_COORD_TOKEN). Redis builds the same text in ctl_lease_acquire's
 * script (HOLDER .. ':' .. TOKEN); the launcher compares it whole. */
typedef struct {
    char holder[64];
    long long token;
} LeaseValue;
#define LEASE_TEXT_MAX 96
int lease_value_format(const LeaseValue *l, char *buf, size_t len);
int lease_value_parse(const char *s, LeaseValue *l, char *err, size_t errlen);

/* --- "HOST:PORT": a process's PROC_REPLICA field (its replica server), KEY_RESUME_HOLDER --
 * HOST 1 to 255 bytes without control characters (split at the last ':', so an IPv6
 * address without brackets works), PORT in [1, 65535]. */
typedef struct {
    char host[256];
    int port;
} Endpoint;
#define ENDPOINT_TEXT_MAX 300
int endpoint_format(const Endpoint *e, char *buf, size_t len);
int endpoint_parse(const char *s, Endpoint *e, char *err, size_t errlen);

/* --- a process's PROC_HELD field: "R:STEP:EPOCH,R:STEP:EPOCH,..." -------------------------
 * The newest generation this process holds of each other rank, republished after an outage
 * (read by the coordinator: what a rank that died meanwhile can be restored from). 0 to max
 * entries, R in [0, DP_MAX_RANKS), STEP >= -1, EPOCH >= 0; single commas. held_parse returns
 * the number of entries (at most max; more is refused), or -1. */
typedef struct {
    int rank;
    long long step;
    long long epoch;
} HeldGen;
#define HELD_TEXT_MAX(n) ((size_t)(n) * 48 + 1)
int held_format(const HeldGen *h, int n, char *buf, size_t len);
int held_parse(const char *s, HeldGen *h, int max, char *err, size_t errlen);

/* --- KEY_INVENTORY's values: "STEP:R,R,...;STEP:R,..." ---------------------------------
 * The checkpoints on one machine's disk (its --resume directory): written by its launcher
 * (checkpoint_inventory), read by the first machine's (decide.h: resume_choose). Groups
 * separated by single ';', newest first: STEP (a 0-based step, >= 0, each below the previous
 * group's), ':', then 1 or more ranks in [0, DP_MAX_RANKS), ascending, separated by single
 * ','; "" says no checkpoint. Held as a flat list of (step, rank) entries in that order (a
 * group's ranks in a row): inventory_parse returns the number of entries (at most max; more
 * is refused), or -1; inventory_format refuses entries out of that order. */
typedef struct {
    int64_t step;
    int rank;
} InventoryEntry;
#define INVENTORY_TEXT_MAX 8192                        /* one machine's inventory, in Redis */
#define INVENTORY_ENTRIES_MAX (INVENTORY_TEXT_MAX / 2) /* what INVENTORY_TEXT_MAX bytes can list */
int inventory_format(const InventoryEntry *e, int n, char *buf, size_t len);
int inventory_parse(const char *s, InventoryEntry *e, int max, char *err, size_t errlen);

/* --- the collective rendezvous's keys, under KEY_GLOO's prefix --------------------------
 * comm_gloo.cc's rendezvous (comm.h: comm_create) keeps, under the prefix it is given
 * (ctl_key_full(KEY_GLOO): "dp:JOB:eEPOCH:gloo"), "PREFIX/m/RANK" (hash: RANK's addresses for
 * each peer, and PROTO_RDZV_HOST_FIELD its host), "PREFIX/n" (the arrivals counter) and
 * "PREFIX/w/RANK" (list: RANK's wake-ups; the coordinator pushes COMM_WAKE_ABORT there when
 * it closes the epoch). proto_rdzv_key writes one into buf (rank ignored for PROTO_RDZV_ARRIVALS)
 * and returns buf; 0, or -1 when it does not fit (buf then holds ""). C and C++ alike. */
typedef enum { PROTO_RDZV_MEMBER, PROTO_RDZV_ARRIVALS, PROTO_RDZV_WAKE } proto_rdzv;
#define PROTO_RDZV_HOST_FIELD "host"
#define PROTO_RDZV_KEY_MAX 512
int proto_rdzv_key(char *buf, size_t len, const char *prefix, proto_rdzv which, int rank);

/* --- KEY_STATE: the job's state ------------------------------------------------------------
 * "running", "stopping", "done" or "failed": ctl_state_set takes the enum, ctl_state_get
 * refuses any other text. */
typedef enum { JOB_STATE_RUNNING, JOB_STATE_STOPPING, JOB_STATE_DONE, JOB_STATE_FAILED, JOB_STATES } job_state;
const char *job_state_name(job_state s);
int job_state_parse(const char *s, job_state *st, char *err, size_t errlen);

/* --- sealed values: "TAG.VALUE" ------------------------------------------------------------
 * Redis is storage the job does not trust (docs/RELIABILITY.md): a value whose integrity
 * decides what the job computes is stored sealed. TAG is 64 lowercase hex characters of
 * crypto_auth (HMAC-SHA-512-256) under the job's control key (the job key's "DPctl001"
 * derivation, secret.h) over "deadpool-seal-1" NUL JOB NUL NAME NUL VALUE; NAME says which key
 * or field the value belongs to, so a value cannot be moved to another key or another job.
 * proto_seal writes the sealed text (PROTO_SEAL_OVERHEAD more bytes than value); proto_unseal
 * verifies s and copies its VALUE into value, or refuses with -1 (value ""): malformed, or a
 * tag that does not verify (written by someone without the job key). Sealed: the launcher's
 * config fields, the job's state, decisions, replica-holder lists, the resumed-state server
 * (ctl_config_*, ctl_state_*, ctl_*_sealed), rank owners and commit records (control_values.c's
 * seal_int). Not sealed (forging them can delay or stop a job, docs/RELIABILITY.md): counters,
 * heartbeats, wake-up lists, leases, telemetry, the collectives' rendezvous addresses. */
#define PROTO_SEAL_KEY_BYTES 32
#define PROTO_SEAL_OVERHEAD 65
int proto_seal(const unsigned char key[PROTO_SEAL_KEY_BYTES], const char *job, const char *name, const char *value,
               char *buf, size_t len);
int proto_unseal(const unsigned char key[PROTO_SEAL_KEY_BYTES], const char *job, const char *name, const char *s,
                 char *value, size_t len, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
