/* redis_connect.h — one way to open a hiredis connection, for C and C++ alike: a host that is
 * an absolute path is a unix socket (the embedded Redis of a one-machine job listens only on a
 * socket in the job's private 0700 directory, see redis_server.c), anything else is TCP.
 *
 * A TCP connection to a loopback address is checked before the caller sends a byte (its AUTH
 * carries the password): the socket that accepted it must belong to this user. Any local user
 * can bind a loopback port the moment its server dies (a Redis master under --redis-ha before
 * Sentinel fails over), and would otherwise be handed the password (issue 34 item 3). A
 * server that runs as another user on purpose (Debian's redis-server service, say) is trusted
 * by naming that user's uid in DEADPOOL_REDIS_TRUST_UID. A refused connection comes back with
 * err = REDIS_ERR_OTHER and errstr naming the owner, like any failed connect. */
#ifndef DEADPOOL_REDIS_CONNECT_H
#define DEADPOOL_REDIS_CONNECT_H

#include <hiredis.h>
#include <sys/time.h>

#define DP_ENV_REDIS_TRUST_UID "DEADPOOL_REDIS_TRUST_UID"

#ifdef __cplusplus
extern "C" {
#endif

redisContext *dp_redis_connect(const char *host, int port, struct timeval tv);

/* The uid that owns the local end of the loopback TCP connection fd is connected to (the
 * server's accepted socket, as /proc/net/tcp and tcp6 list it): 1 with *uid, 0 when fd's peer
 * is not on loopback, -1 when it cannot be found. */
int dp_loopback_peer_uid(int fd, unsigned *uid);

#ifdef __cplusplus
}
#endif

#endif
