/* netns.h — network-loss fault injection (`--inject netdown:RANK@STEP`, root only).
 *
 * The launcher runs that rank's worker in a network namespace of its own, joined to the host
 * by a veth pair (host side 10.X.0.1/30, namespace side 10.X.0.2/30, no route beyond that
 * subnet), so that the worker reaches Redis and its peers only through a link that can be cut. At the
 * injected step the worker takes its side of the link down itself; after the recovery
 * decision the launcher brings it back up, and the cut-off worker finds itself fenced. The
 * namespace (and with it the veth pair) is deleted at the end. One such rank per job: the
 * host does not forward between namespaces. */
#ifndef DEADPOOL_NETNS_H
#define DEADPOOL_NETNS_H

#include <stddef.h>

typedef struct {
    int active;
    int rank;             /* the rank that runs inside */
    char ns[32];          /* namespace name */
    char host_if[16], ns_if[16];
    char host_addr[32];   /* address host-side processes bind to and Redis listens on */
    char ns_addr[32];     /* the namespaced worker's address */
    int link_down;
} NetNs;

/* Creates the namespace and link for `rank` of job `job`. 0, or -1 + err (e.g. not root). */
int netns_create(NetNs *n, const char *job, int rank, char *err, size_t errlen);
/* Brings the namespace side of the link back up (the cut-off worker can talk again). */
void netns_link_up(NetNs *n);
void netns_destroy(NetNs *n);
/* Deletes the namespaces and links of launchers that died without cleaning up (kill -9);
 * each namespace records its owner. Returns how many were removed. Root only. */
int netns_reap(void);

/* In the worker: takes its own side of the link down (DEADPOOL_NETDOWN_IF names it). */
int netns_cut_own_link(void);

#endif
