/* netns.c — network namespaces and veth links for network-loss fault injection, through
 * iproute2's `ip` (run with fork/exec, no shell). */
#include "netns.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

/* Runs `ip` with the given arguments (NULL-terminated); 0 when it exits 0. */
static int run_ip(const char *const *args) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        const char *argv[16];
        int n = 0;
        argv[n++] = "ip";
        for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execvp("ip", (char *const *)argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

#define IP(...) run_ip((const char *const[]){__VA_ARGS__, NULL})

/* Who owns a namespace: NETNS_OWNERS/NAME holds "PID HOST_IF" of the launcher that made it.
 * A launcher killed with -9 cannot delete its namespace; the next one does (netns_reap). */
#define NETNS_OWNERS "/run/deadpool-netns"

static void owner_path(char *buf, size_t len, const char *ns) { snprintf(buf, len, "%s/%s", NETNS_OWNERS, ns); }

static void owner_write(const NetNs *n) {
    char path[256];
    if (mkdir(NETNS_OWNERS, 0700) != 0 && errno != EEXIST) return;
    owner_path(path, sizeof path, n->ns);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%d %s\n", (int)getpid(), n->host_if);
    if (fclose(f) == 0) rename(tmp, path); /* whole or absent: a reaper never reads half of it */
    else unlink(tmp);
}

int netns_reap(void) {
    DIR *d = opendir(NETNS_OWNERS);
    if (!d) return 0;
    int reaped = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.")) continue;
        char path[512], host_if[32] = "";
        snprintf(path, sizeof path, "%s/%s", NETNS_OWNERS, e->d_name);
        int pid = 0;
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int got = fscanf(f, "%d %31s", &pid, host_if);
        fclose(f);
        if (got != 2 || pid <= 0) continue; /* not ours to judge */
        if (kill(pid, 0) == 0 || errno == EPERM) continue; /* its launcher lives */
        IP("link", "del", host_if);
        IP("netns", "del", e->d_name);
        unlink(path);
        log_msg("removed network namespace %s, left behind by launcher %d (no longer running)", e->d_name, pid);
        reaped++;
    }
    closedir(d);
    return reaped;
}


int netns_create(NetNs *n, const char *job, int rank, char *err, size_t errlen) {
    memset(n, 0, sizeof *n);
    if (geteuid() != 0) {
        snprintf(err, errlen, "--inject netdown needs root: it puts rank %d in a network namespace", rank);
        return -1;
    }
    /* A per-job subnet, so concurrent jobs on one machine do not collide. */
    unsigned h = 0;
    for (const char *c = job; *c; c++) h = h * 31 + (unsigned char)*c;
    int octet2 = 200 + (int)(h % 50), octet3 = (int)((h / 50) % 250);
    n->rank = rank;
    snprintf(n->ns, sizeof n->ns, "dp%.8sr%d", job, rank);
    snprintf(n->host_if, sizeof n->host_if, "dph%.8s", job);
    snprintf(n->ns_if, sizeof n->ns_if, "dpn%.8s", job);
    snprintf(n->host_addr, sizeof n->host_addr, "10.%d.%d.1", octet2, octet3);
    snprintf(n->ns_addr, sizeof n->ns_addr, "10.%d.%d.2", octet2, octet3);
    char host_cidr[40], ns_cidr[40];
    snprintf(host_cidr, sizeof host_cidr, "%s/30", n->host_addr);
    snprintf(ns_cidr, sizeof ns_cidr, "%s/30", n->ns_addr);
    if (IP("netns", "add", n->ns) != 0) {
        snprintf(err, errlen, "ip netns add %s failed (is iproute2 installed?)", n->ns);
        return -1;
    }
    n->active = 1;
    owner_write(n);
    /* No default route: the namespace reaches its own /30 (Redis and the peers listen on the
     * host side's address) and nothing beyond it. */
    if (IP("link", "add", n->host_if, "type", "veth", "peer", "name", n->ns_if) != 0 ||
        IP("link", "set", n->ns_if, "netns", n->ns) != 0 || IP("addr", "add", host_cidr, "dev", n->host_if) != 0 ||
        IP("link", "set", n->host_if, "up") != 0 ||
        IP("netns", "exec", n->ns, "ip", "addr", "add", ns_cidr, "dev", n->ns_if) != 0 ||
        IP("netns", "exec", n->ns, "ip", "link", "set", n->ns_if, "up") != 0 ||
        IP("netns", "exec", n->ns, "ip", "link", "set", "lo", "up") != 0) {
        snprintf(err, errlen, "setting up the veth link of namespace %s failed", n->ns);
        netns_destroy(n);
        return -1;
    }
    return 0;
}

void netns_link_up(NetNs *n) {
    if (!n->active || !n->link_down) return;
    if (IP("netns", "exec", n->ns, "ip", "link", "set", n->ns_if, "up") == 0) n->link_down = 0;
}

void netns_destroy(NetNs *n) {
    if (!n->active) return;
    IP("link", "del", n->host_if); /* removes both ends */
    IP("netns", "del", n->ns);
    char path[256];
    owner_path(path, sizeof path, n->ns);
    unlink(path);
    n->active = 0;
}

int netns_cut_own_link(void) {
    const char *ifname = getenv("DEADPOOL_NETDOWN_IF");
    if (!ifname || !*ifname) {
        log_msg("netdown: this worker does not run in a fault-injection namespace");
        return -1;
    }
    return IP("link", "set", ifname, "down");
}
