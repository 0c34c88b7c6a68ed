/* control_records.c — the job's records whose values have a codec of their own (protocol.h):
 * each key here has its one accessor pair, which puts the key and the codec together, so no
 * caller does (tests/e2e_code.sh checks that no file outside src/control builds a key). The
 * records: injected faults (which fired, and when the last one of a rank did), the joins of
 * an epoch (timing and rendezvous statistics), the newest step done at a decision,
 * the no-spare persist request, the processes' exits, the machines' liveness, what each
 * machine has on disk and who serves a resumed rank's state, the progress line, and the
 * process-id counter's floor. */
#include "control.h"
#include "control_internal.h"
#include "protocol.h"
#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Record i is key kinds[i] with numbers a[i], b[i] (b NULL: 0); its value into values + i * len
 * ("" when absent: present[i] = 0, present may be NULL). One MGET (ctl_get_many). 0 / -1. */
static int records_get(ctl_t *c, const ctl_key *kinds, const long long *a, const long long *b, int n, char *values,
                       size_t len, int *present) {
    char (*names)[64] = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    const char **suffixes = malloc(sizeof *suffixes * (size_t)(n > 0 ? n : 1));
    int rc = -1;
    if (names && suffixes) {
        for (int i = 0; i < n; i++) suffixes[i] = ctl_key_suffix(names[i], sizeof names[i], kinds[i], a[i], b ? b[i] : 0);
        rc = ctl_get_many(c, suffixes, n, values, len, present);
    } else {
        ctl_set_error(c, "out of memory for %d records", n);
    }
    free(names);
    free(suffixes);
    return rc;
}

/* KEY_LAST_STEP's value (an int: the coordinator keeps it as one). 0 / -1. */
static int last_step_parse(const char *text, long long *step) {
    return proto_int_parse(text, "last_step", 0, INT_MAX, step, NULL, 0);
}

/* --- injected faults ------------------------------------------------------------------- */

int ctl_fault_last_set(ctl_t *c, const FaultRecord *f) {
    char key[CTL_KEY_MAX], value[FAULT_RECORD_TEXT_MAX];
    if (fault_record_format(f, value, sizeof value) != 0) {
        ctl_set_error(c, "fault record of rank %d: does not format", f->rank);
        return -1;
    }
    return ctl_set(c, ctl_key_suffix(key, sizeof key, KEY_FAULT_LAST, f->rank, 0), value);
}

int ctl_fault_last_take(ctl_t *c, int rank, FaultRecord *f) {
    char key[CTL_KEY_MAX], value[128], err[256];
    if (ctl_take(c, ctl_key_suffix(key, sizeof key, KEY_FAULT_LAST, rank, 0), value, sizeof value) != 0) return 0;
    if (fault_record_parse(value, f, err, sizeof err) != 0) {
        log_msg("rank %d: %s", rank, err);
        return 0;
    }
    return f->rank == rank;
}

int ctl_fault_claim(ctl_t *c, int index, long proc) {
    char key[CTL_KEY_MAX];
    return ctl_set_nx(c, ctl_key_suffix(key, sizeof key, KEY_INJECTED, index, proc), "1");
}

int ctl_chaos_claim(ctl_t *c, long long step) {
    char key[CTL_KEY_MAX];
    return ctl_set_nx(c, ctl_key_suffix(key, sizeof key, KEY_CHAOS, step, 0), "1");
}

/* --- an epoch's joins, the step a decision saw ---------------------------------- */

int ctl_join_timing_set(ctl_t *c, long epoch, int rank, const JoinTiming *t) {
    char key[CTL_KEY_MAX], value[JOIN_TIMING_TEXT_MAX];
    if (join_timing_format(t, value, sizeof value) != 0) return -1;
    return ctl_set(c, ctl_key_suffix(key, sizeof key, KEY_TIMING, epoch, rank), value);
}

int ctl_join_stats_set(ctl_t *c, long epoch, int rank, const JoinStats *s) {
    char key[CTL_KEY_MAX], value[JOIN_STATS_TEXT_MAX];
    if (join_stats_format(s, value, sizeof value) != 0) return -1;
    return ctl_set(c, ctl_key_suffix(key, sizeof key, KEY_JOIN_STATS, epoch, rank), value);
}

int ctl_joins_get(ctl_t *c, long epoch, int world, JoinTiming *t, int *has_t, JoinStats *s, int *has_s, long long *last) {
    int nk = 2 * world + 1, rc = -1;
    ctl_key *kinds = malloc(sizeof *kinds * (size_t)nk);
    long long *a = malloc(sizeof *a * (size_t)nk), *b = malloc(sizeof *b * (size_t)nk);
    char (*values)[128] = calloc((size_t)nk, sizeof *values);
    if (kinds && a && b && values) { /* eEPOCH:timing:R, eEPOCH:join:R, last_step */
        for (int r = 0; r < world; r++) {
            kinds[r] = KEY_TIMING, a[r] = epoch, b[r] = r;
            kinds[world + r] = KEY_JOIN_STATS, a[world + r] = epoch, b[world + r] = r;
        }
        kinds[2 * world] = KEY_LAST_STEP, a[2 * world] = b[2 * world] = 0;
        rc = records_get(c, kinds, a, b, nk, values[0], sizeof values[0], NULL);
    }
    for (int r = 0; r < world; r++) { /* an absent record ("") is a member that wrote none */
        char err[256];
        const char *vt = rc == 0 ? values[r] : "", *vs = rc == 0 ? values[world + r] : "";
        has_t[r] = vt[0] && join_timing_parse(vt, &t[r], err, sizeof err) == 0;
        if (vt[0] && !has_t[r]) log_msg("rank %d: %s", r, err);
        has_s[r] = vs[0] && join_stats_parse(vs, &s[r], err, sizeof err) == 0;
        if (vs[0] && !has_s[r]) log_msg("rank %d: %s", r, err);
    }
    if (rc != 0 || !values[2 * world][0] || last_step_parse(values[2 * world], last) != 0) *last = -1;
    free(kinds);
    free(a);
    free(b);
    free(values);
    return rc;
}

int ctl_last_step_get(ctl_t *c, long long *step) {
    char key[CTL_KEY_MAX], v[32];
    if (ctl_get(c, ctl_key_suffix(key, sizeof key, KEY_LAST_STEP, 0, 0), v, sizeof v) != 0) return -1;
    return last_step_parse(v, step);
}

void ctl_batch_last_step(ctl_t *c, long long step) {
    char key[CTL_KEY_MAX], v[32];
    proto_int_format(step, v, sizeof v);
    ctl_batch_set(c, ctl_key_suffix(key, sizeof key, KEY_LAST_STEP, 0, 0), v);
}

/* --- no spare: the persist request --------------------------------------------------------- */

int ctl_persist_request_set(ctl_t *c, const PersistRequest *p) {
    char key[CTL_KEY_MAX], *text = malloc(PERSIST_REQ_TEXT_MAX);
    if (!text) { ctl_set_error(c, "out of memory for a persist request"); return -1; }
    int rc = persist_request_format(p, text, PERSIST_REQ_TEXT_MAX) == 0 ? 0 : -2;
    if (rc == 0) rc = ctl_set(c, ctl_key_suffix(key, sizeof key, KEY_PERSIST_REQ, 0, 0), text);
    free(text);
    return rc;
}

int ctl_persist_request_get(ctl_t *c, PersistRequest *p, char *err, size_t errlen) {
    char key[CTL_KEY_MAX], *text = malloc(PERSIST_REQ_TEXT_MAX);
    if (!text) { set_err(err, errlen, "out of memory for a persist request"); return -1; }
    int rc = ctl_get(c, ctl_key_suffix(key, sizeof key, KEY_PERSIST_REQ, 0, 0), text, PERSIST_REQ_TEXT_MAX) == 0 ? 1 : 0;
    if (rc == 1 && persist_request_parse(text, p, err, errlen) != 0) rc = -1;
    free(text);
    return rc;
}

/* --- processes' exits, machines' liveness ---------------------------------------------------- */

int ctl_exits_get(ctl_t *c, const long *procs, int n, ExitRecord *ex) {
    ctl_key *kinds = malloc(sizeof *kinds * (size_t)(n > 0 ? n : 1));
    long long *a = malloc(sizeof *a * (size_t)(n > 0 ? n : 1));
    char (*how)[32] = malloc(sizeof *how * (size_t)(n > 0 ? n : 1));
    int rc = -1;
    if (kinds && a && how) {
        for (int i = 0; i < n; i++) kinds[i] = KEY_EXIT, a[i] = procs[i];
        rc = records_get(c, kinds, a, NULL, n, how[0], sizeof how[0], NULL);
    }
    for (int i = 0; i < n; i++) { /* "" (no record) or malformed: nothing known of how it ended */
        char err[256];
        if (rc != 0 || !how[i][0] || exit_record_parse(how[i], &ex[i], err, sizeof err) != 0) {
            if (rc == 0 && how[i][0]) log_msg("process %ld: %s", procs[i], err);
            ex[i] = (ExitRecord){.how = EXITED_HOWS, .wall_ms = 0};
        }
    }
    free(kinds);
    free(a);
    free(how);
    return rc;
}

int ctl_nodes_alive(ctl_t *c, const int *index, int n, int *present) {
    if (n <= 0) return 0;
    ctl_key *kinds = malloc(sizeof *kinds * (size_t)n);
    long long *a = malloc(sizeof *a * (size_t)n);
    char (*vals)[8] = malloc(sizeof *vals * (size_t)n);
    int rc = -1;
    if (kinds && a && vals) {
        for (int i = 0; i < n; i++) kinds[i] = KEY_NODE_ALIVE, a[i] = index[i];
        rc = records_get(c, kinds, a, NULL, n, vals[0], sizeof vals[0], present);
    }
    free(kinds);
    free(a);
    free(vals);
    return rc;
}

/* --- resuming across machines: inventories, the states' servers ------------------------------- */

int ctl_inventory_set(ctl_t *c, int machine, const char *inventory) {
    char key[CTL_KEY_MAX], idx[16];
    proto_int_format(machine, idx, sizeof idx);
    return ctl_hash_set(c, ctl_key_suffix(key, sizeof key, KEY_INVENTORY, 0, 0), idx, inventory);
}

int ctl_inventories_get(ctl_t *c, int *machines, char *inventories, size_t len, int max) {
    char key[CTL_KEY_MAX], (*fields)[16] = malloc(sizeof *fields * (size_t)(max > 0 ? max : 1));
    if (!fields) { ctl_set_error(c, "out of memory for %d machines", max); return -1; }
    int n = ctl_hash_getall(c, ctl_key_suffix(key, sizeof key, KEY_INVENTORY, 0, 0), fields[0], sizeof fields[0],
                            inventories, len, max);
    int k = 0;
    for (int i = 0; i < n; i++) { /* a field that is not a machine's index counts for nothing */
        long long m;
        if (proto_int_parse(fields[i], "inventory machine", 0, INT_MAX, &m, NULL, 0) != 0) continue;
        machines[k] = (int)m;
        if (k != i) memmove(inventories + (size_t)k * len, inventories + (size_t)i * len, len);
        k++;
    }
    free(fields);
    return n < 0 ? -1 : k;
}

int ctl_resume_holder_set(ctl_t *c, int rank, const Endpoint *where) {
    char key[CTL_KEY_MAX], text[ENDPOINT_TEXT_MAX];
    if (endpoint_format(where, text, sizeof text) != 0) {
        ctl_set_error(c, "rank %d's resumed state: its server's address does not format", rank);
        return -1;
    }
    return ctl_set_sealed(c, ctl_key_suffix(key, sizeof key, KEY_RESUME_HOLDER, rank, 0), text);
}

int ctl_resume_holder_get(ctl_t *c, int rank, Endpoint *where, char *err, size_t errlen) {
    char key[CTL_KEY_MAX], text[ENDPOINT_TEXT_MAX + 8];
    if (ctl_get_sealed(c, ctl_key_suffix(key, sizeof key, KEY_RESUME_HOLDER, rank, 0), text, sizeof text) != 0) return 0;
    return endpoint_parse(text, where, err, errlen) == 0 ? 1 : -1;
}

/* --- the progress line, the process ids' floor ------------------------------------------------ */

int ctl_progress_get(ctl_t *c, char *json, size_t len) {
    char key[CTL_KEY_MAX];
    return ctl_get(c, ctl_key_suffix(key, sizeof key, KEY_PROGRESS, 0, 0), json, len);
}

int ctl_proc_ids_at_least(ctl_t *c, long long last) {
    char key[CTL_KEY_MAX];
    return ctl_counter_at_least(c, ctl_key_suffix(key, sizeof key, KEY_PROCS, 0, 0), last);
}
