/* recovery.c — (de)serialising, publishing and reading membership decisions. */
#include "recovery.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int decision_format(const Decision *d, char *buf, size_t len) {
    size_t used = 0;
#define APPEND(...)                                                              \
    do {                                                                         \
        int n_ = snprintf(buf + used, len - used, __VA_ARGS__);                  \
        if (n_ < 0 || (size_t)n_ >= len - used) return -1;                       \
        used += (size_t)n_;                                                      \
    } while (0)
    APPEND("epoch=%ld\nworld=%d\nrollback=%lld\n", d->epoch, d->world, d->rollback);
    APPEND("t_fail_ms=%" PRId64 "\nt_detect_ms=%" PRId64 "\nt_decide_ms=%" PRId64 "\n", d->t_fail_ms, d->t_detect_ms,
           d->t_decide_ms);
    for (int r = 0; r < d->world; r++) APPEND("rank=%d:%ld\n", r, d->procs[r]);
    for (int i = 0; i < d->nfailed; i++)
        APPEND("failed=%d:%s:%ld:%ld\n", d->failed[i].rank, d->failed[i].kind, d->failed[i].old_proc,
               d->failed[i].spare_proc);
#undef APPEND
    return 0;
}

static int decision_parse(const char *text, Decision *d) {
    memset(d, 0, sizeof *d);
    d->world = -1;
    const char *line = text;
    while (*line) {
        int r;
        long p, q;
        long long v;
        char kind[16];
        if (sscanf(line, "epoch=%lld", &v) == 1) d->epoch = (long)v;
        else if (sscanf(line, "world=%d", &r) == 1) d->world = r;
        else if (sscanf(line, "rollback=%lld", &v) == 1) d->rollback = v;
        else if (sscanf(line, "t_fail_ms=%lld", &v) == 1) d->t_fail_ms = v;
        else if (sscanf(line, "t_detect_ms=%lld", &v) == 1) d->t_detect_ms = v;
        else if (sscanf(line, "t_decide_ms=%lld", &v) == 1) d->t_decide_ms = v;
        else if (sscanf(line, "rank=%d:%ld", &r, &p) == 2 && r >= 0 && r < RECOVERY_MAX_RANKS) d->procs[r] = p;
        else if (sscanf(line, "failed=%d:%15[^:]:%ld:%ld", &r, kind, &p, &q) == 4 && d->nfailed < RECOVERY_MAX_RANKS) {
            FailedRank *f = &d->failed[d->nfailed++];
            f->rank = r;
            snprintf(f->kind, sizeof f->kind, "%s", kind);
            f->old_proc = p;
            f->spare_proc = q;
        }
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return d->world > 0 && d->world <= RECOVERY_MAX_RANKS ? 0 : -1;
}

int decision_publish(ctl_t *c, const Decision *d) {
    static char text[RECOVERY_MAX_RANKS * 96 + 1024];
    char key[64];
    if (decision_format(d, text, sizeof text) != 0) return -1;
    snprintf(key, sizeof key, "decision:%ld", d->epoch);
    if (ctl_set(c, key, text) != 0) return -1;
    for (int i = 0; i < d->nfailed; i++)
        if (ctl_set_rank_owner(c, d->failed[i].rank, d->failed[i].spare_proc) != 0) return -1;
    if (ctl_epoch_set(c, d->epoch) != 0) return -1;
    for (int r = 0; r < d->world; r++) ctl_notify(c, d->procs[r], "notice", d->epoch);
    return 0;
}

int decision_read(ctl_t *c, long epoch, Decision *d) {
    static char text[RECOVERY_MAX_RANKS * 96 + 1024];
    char key[64];
    snprintf(key, sizeof key, "decision:%ld", epoch);
    if (ctl_get(c, key, text, sizeof text) != 0) return -1;
    return decision_parse(text, d);
}

int decision_rank_of(const Decision *d, long proc_id) {
    for (int r = 0; r < d->world; r++)
        if (d->procs[r] == proc_id) return r;
    return -1;
}

int decision_rank_replaced(const Decision *d, int rank) {
    for (int i = 0; i < d->nfailed; i++)
        if (d->failed[i].rank == rank) return 1;
    return 0;
}

int holders_record(ctl_t *c, long epoch, int rank, const char *list) {
    char key[64];
    snprintf(key, sizeof key, "e%ld:holders:%d", epoch, rank);
    return ctl_set(c, key, list);
}

int holders_read(ctl_t *c, long epoch, int rank, char *list, size_t len) {
    char key[64];
    snprintf(key, sizeof key, "e%ld:holders:%d", epoch, rank);
    return ctl_get(c, key, list, len);
}

int fence_epoch(ctl_t *c, long epoch) {
    char key[64];
    snprintf(key, sizeof key, "e%ld:fenced", epoch);
    return ctl_set(c, key, "1");
}

int epoch_fenced(ctl_t *c, long epoch) {
    char key[64], v[8];
    snprintf(key, sizeof key, "e%ld:fenced", epoch);
    return ctl_get(c, key, v, sizeof v) == 0 ? 1 : 0;
}
