/* redis_connect.h — one way to open a hiredis connection, for C and C++ alike: a host that is
 * an absolute path is a unix socket (the embedded Redis of a one-machine job listens only on a
 * socket in the job's private 0700 directory, see redis_server.c), anything else is TCP. */
#ifndef DEADPOOL_REDIS_CONNECT_H
#define DEADPOOL_REDIS_CONNECT_H

#include <hiredis.h>
#include <sys/time.h>

static inline redisContext *dp_redis_connect(const char *host, int port, struct timeval tv) {
    if (host && host[0] == '/') return redisConnectUnixWithTimeout(host, tv);
    return redisConnectWithTimeout(host, port, tv);
}

#endif
