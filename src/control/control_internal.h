/* control_internal.h — what the control-plane client's files share (not installed, not
 * included outside src/control): the connection's state and the commands sent over it, the
 * key builder and the seal. Callers outside the client use control.h only. */
#ifndef DEADPOOL_CONTROL_INTERNAL_H
#define DEADPOOL_CONTROL_INTERNAL_H

#include <hiredis.h>
#include <string.h>

#include "control.h"
#include "protocol.h"

#define CTL_JOB_MAX 128
#define CTL_KEY_MAX 256
#define CTL_ERR_MAX 512

struct ctl {
    redisContext *rc;
    redis_addr addr;
    int timeout_ms;
    char job[CTL_JOB_MAX + 1];
    char err[CTL_ERR_MAX];
    unsigned long long round_trips, mark; /* ctl_round_trips, ctl_mark */
    int batch_n, batch_failed, batch_multi; /* commands appended since ctl_batch_begin */
    int stale;                /* the server answered as a replica: reconnect (through the sentinels) */
    int replicas;             /* ctl_wait_replica: the master's replicas, as ROLE said ... */
    double replicas_checked_ms; /* ... then */
    int transient;            /* the last failure was the server's absence, not its answer (ctl_error_transient) */
    int refused;              /* the last sealed read found a value that did not verify (ctl_value_refused) */
    int state_refused;        /* the last state read was forged (logged once in a row: the state is polled) */
    double refused_logged_ms; /* when a forged value was last logged (at most one line a second: values are polled) */
    unsigned long absences;   /* such failures so far (ctl_absences) */
    unsigned char seal_key[PROTO_SEAL_KEY_BYTES]; /* the control key (ctl_set_job_key) ... */
    int keyed;                                    /* ... once set */
};

#define MGET_CHUNK 256 /* keys per MGET */

/* Copies src into dst (capacity cap). 0, or -1 when it does not fit. */
static inline int copy_checked(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

const char *ctl_make_key(const ctl_t *c, char *key, size_t cap, ctl_key k, long long a, long long b);
void ctl_suffix_key(const ctl_t *c, char *key, size_t cap, const char *suffix);
const char *ctl_config_field_checked(ctl_t *c, ctl_config_field f);
const char *ctl_proc_field_checked(ctl_t *c, ctl_proc_field f);
void ctl_set_error(ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ctl_job_name_valid(const char *job);
int ctl_demoted_error(const char *msg);
void ctl_reply_lost(ctl_t *c, const char *what);
void ctl_reply_refused(ctl_t *c, const char *what, const char *msg);
int ctl_ensure_connected(ctl_t *c);
redisReply *ctl_argv_command(ctl_t *c, int argc, const char **argv, const size_t *lens, const char *what);
redisReply *ctl_command(ctl_t *c, const char *fmt, ...);
int ctl_command_integer(ctl_t *c, long long *out, const char *fmt, ...);
int ctl_command_ok(ctl_t *c, const char *fmt, ...);
int ctl_reply_int(ctl_t *c, const redisReply *r, const char *what, long long lo, long long hi, long long *v);
char *ctl_seal_value(ctl_t *c, const char *name, const char *value);
int ctl_unseal_reply(ctl_t *c, const char *name, const redisReply *r, char *value, size_t len);
char *ctl_seal_int(ctl_t *c, ctl_key k, long long a, long long b, long long v);
int ctl_unseal_int(ctl_t *c, ctl_key k, long long a, long long b, const redisReply *r, const char *what,
                      long long lo, long long hi, long long *v);
redisReply *ctl_mget(ctl_t *c, char (*keys)[CTL_KEY_MAX], int n);
void ctl_batch_append(ctl_t *c, const char *fmt, ...);

#endif
