/* redis_connect.c — dp_redis_connect (redis_connect.h): connect, then, on loopback, check
 * whose socket answered before anything is sent. */
#include "redis_connect.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The entry of /proc/net/FILE whose local end is `local` and remote end is `remote` (each
 * "HEX:PORT" as the kernel prints them): its uid. 1 found, 0 not. */
static int proc_net_uid(const char *file, const char *local, const char *remote, unsigned *uid) {
    FILE *f = fopen(file, "re");
    if (!f) return 0;
    char line[512], l[64], r[64];
    int found = 0;
    if (fgets(line, sizeof line, f)) /* the header */
        while (!found && fgets(line, sizeof line, f)) {
            unsigned u;
            /* sl local rem st tx:rx tr:when retrnsmt uid */
            if (sscanf(line, " %*s %63s %63s %*s %*s %*s %*s %u", l, r, &u) == 3 && strcmp(l, local) == 0 &&
                strcmp(r, remote) == 0) {
                *uid = u;
                found = 1;
            }
        }
    fclose(f);
    return found;
}

/* ADDR as /proc/net/tcp{,6} prints it: the address's 32-bit words in host order, %08X each,
 * then ':' and the port, %04X. */
static void proc_net_addr(const struct sockaddr_storage *ss, char *out, size_t len) {
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        snprintf(out, len, "%08X:%04X", (unsigned)a->sin_addr.s_addr, (unsigned)ntohs(a->sin_port));
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uint32_t w[4];
        memcpy(w, &a->sin6_addr, sizeof w);
        snprintf(out, len, "%08X%08X%08X%08X:%04X", (unsigned)w[0], (unsigned)w[1], (unsigned)w[2], (unsigned)w[3],
                 (unsigned)ntohs(a->sin6_port));
    }
}

static int is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

int dp_loopback_peer_uid(int fd, unsigned *uid) {
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return -1;
    if (!is_loopback(&peer)) return 0;
    char local[64], remote[64];
    /* the server's accepted socket: its local end is our peer, its remote end is us */
    proc_net_addr(&peer, local, sizeof local);
    proc_net_addr(&me, remote, sizeof remote);
    /* The accepted socket may not be listed the instant connect returns: a few looks. */
    for (int i = 0; i < 50; i++) {
        if (proc_net_uid(peer.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6", local, remote, uid)) return 1;
        usleep(1000);
    }
    return -1;
}

/* The uid a loopback server may run as besides this user's: DEADPOOL_REDIS_TRUST_UID, or -1. */
static long trusted_uid(void) {
    const char *s = getenv(DP_ENV_REDIS_TRUST_UID);
    char *end;
    if (!s || !*s) return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 0 ? -1 : v;
}

redisContext *dp_redis_connect(const char *host, int port, struct timeval tv) {
    if (host && host[0] == '/') return redisConnectUnixWithTimeout(host, tv);
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c || c->err) return c;
    unsigned uid = 0;
    int got = dp_loopback_peer_uid(c->fd, &uid);
    if (got == 0 || (got == 1 && (uid == (unsigned)geteuid() || (long)uid == trusted_uid()))) return c;
    /* Refused before a byte is sent: the caller sees a failed connect and frees c. */
    close(c->fd);
    c->fd = -1;
    c->err = REDIS_ERR_OTHER;
    if (got == 1)
        snprintf(c->errstr, sizeof c->errstr, "served by uid %u, not this user (uid %u): password not sent; %s=%u trusts it", uid,
                 (unsigned)geteuid(), DP_ENV_REDIS_TRUST_UID, uid);
    else
        snprintf(c->errstr, sizeof c->errstr, "whose socket answered is unknown (/proc/net/tcp): password not sent");
    return c;
}
