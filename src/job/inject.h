/* inject.h — the --inject grammar, parsed in one place.
 *
 *   LIST  := FAULT ("," FAULT)*
 *   FAULT := ("kill" | "stop" | "netdown") ":" RANK "@" STEP   fires mid-step STEP (1-based)
 *          | "corrupt" ":" RANK "@" STEP                       mid-step STEP, every holder of
 *                                                              RANK's replicas damages them
 *          | "rkill" ":" RANK "@" EPOCH                        the process taking RANK dies
 *                                                              while it recovers into EPOCH
 *                                                              (0: RANK's first process, as the
 *                                                              job starts, before the rendezvous)
 * Each fault fires once per job (the runtime marks it fired in Redis by its index). */
#ifndef DEADPOOL_INJECT_H
#define DEADPOOL_INJECT_H

#include <stddef.h>

#define INJECT_MAX 64

typedef enum { FAULT_KILL = 0, FAULT_STOP = 1, FAULT_NETDOWN = 2, FAULT_RKILL = 3, FAULT_CORRUPT = 4 } fault_kind;

typedef struct {
    fault_kind kind;
    int rank;
    int at;   /* STEP (1-based) or, for rkill, EPOCH */
} FaultSpec;

/* Parses list into out (up to max); ranks must be < workers. The count, or -1 + err naming
 * the fault that does not fit the grammar. */
int inject_parse(const char *list, int workers, FaultSpec *out, int max, char *err, size_t errlen);
const char *fault_kind_name(fault_kind k);
/* The rank of the first netdown fault in list, -1 if none. */
int inject_netdown_rank(const char *list);

#endif
