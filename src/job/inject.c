/* inject.c — parser of the --inject grammar (inject.h). */
#include "inject.h"

#include <stdio.h>
#include <string.h>

static const char *const KINDS[] = {"kill", "stop", "netdown", "rkill", "corrupt"};
#define NKINDS (int)(sizeof KINDS / sizeof KINDS[0])

const char *fault_kind_name(fault_kind k) { return (int)k < NKINDS ? KINDS[k] : "?"; }

int inject_parse(const char *list, int workers, FaultSpec *out, int max, char *err, size_t errlen) {
    const char *at = list;
    int n = 0;
    while (*at) {
        char kind[16];
        int rank, when, used = 0, k = -1;
        if (sscanf(at, "%15[a-z]:%d@%d%n", kind, &rank, &when, &used) == 3)
            for (int i = 0; i < NKINDS; i++)
                if (!strcmp(kind, KINDS[i])) k = i;
        if (k < 0 || rank < 0) {
            snprintf(err, errlen, "--inject: expected kill|stop|netdown|corrupt:RANK@STEP or rkill:RANK@EPOCH, found '%.60s'", at);
            return -1;
        }
        if (k == FAULT_RKILL && when < 0) { /* epoch 0 is the job's start */
            snprintf(err, errlen, "--inject %.*s: expected an epoch >= 0 (0: as the job starts, 1: the first recovery)", used,
                     at);
            return -1;
        }
        if (k != FAULT_RKILL && when < 1) { /* 1-based like the progress line and ckpt/step_N */
            snprintf(err, errlen, "--inject %.*s: steps start at 1 (STEP counts like the progress line and "
                     "ckpt/step_N: the first step is 1)", used, at);
            return -1;
        }
        if (rank >= workers) {
            snprintf(err, errlen, "--inject %.60s: expected a rank < --workers (%d), found %d", at, workers, rank);
            return -1;
        }
        if (n >= max) { snprintf(err, errlen, "--inject: expected at most %d faults", max); return -1; }
        out[n++] = (FaultSpec){.kind = (fault_kind)k, .rank = rank, .at = when};
        at += used;
        if (*at == ',') at++;
        else if (*at) { snprintf(err, errlen, "--inject: unexpected '%.30s'", at); return -1; }
    }
    return n;
}

int inject_netdown_rank(const char *list) {
    FaultSpec f[INJECT_MAX];
    char err[8];
    int n = inject_parse(list, 1 << 30, f, INJECT_MAX, err, sizeof err);
    for (int i = 0; i < n; i++)
        if (f[i].kind == FAULT_NETDOWN) return f[i].rank;
    return -1;
}
