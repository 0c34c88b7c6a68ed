/* redis_server.h — the `deadpool` program's own Redis servers (redis_server.c): the embedded
 * server of a job started without --redis, the --redis-ha replica and sentinels, a Slurm job's
 * control plane, and the launcher's private run directory they keep their files in. The tool's,
 * not the library's: a training process only connects (control.h). */
#ifndef DEADPOOL_REDIS_SERVER_H
#define DEADPOOL_REDIS_SERVER_H

#include "control.h"

/* --- embedded redis-server, for `deadpool run` without --redis ------------------------- */
typedef struct {
    int pid;
    int port;                      /* 0 when it listens on sock only */
    char sock[REDIS_UNIX_PATH_MAX]; /* its unix socket, "" = none (TCP on 127.0.0.1:port) */
    char password[65];
    char host[64];      /* the address it listens on ("" = 127.0.0.1) */
} redis_server;

/* Starts redis-server on a free loopback port with a random password (passed on stdin, never
 * on the command line), no persistence, and waits (bounded by timeout_ms) until it answers
 * PING. 0, or -1 with err set (e.g. redis-server not installed). */
int redis_server_start(redis_server *s, int timeout_ms, char *err, size_t errlen);
/* The same on a unix socket only: DIR/redis.sock, mode 0700 (port 0: no TCP). DIR must be a
 * private (0700) directory of this user: then no other user can connect to the server at all. */
int redis_server_start_private(redis_server *s, const char *dir, int timeout_ms, char *err, size_t errlen);
/* --redis-ha: a replica of master (its password; whatever it writes goes to dir, a private
 * directory), and a sentinel (its configuration file in dir) that monitors master under
 * `name` with the others: 0, or -1 + err. */
int redis_server_start_replica(redis_server *s, const redis_server *master, const char *dir, int timeout_ms, char *err,
                               size_t errlen);
/* Waits (up to timeout_ms) until replica s has its master's data (its link is up). 0 / -1. */
int redis_server_replica_synced(const redis_server *s, int timeout_ms);
int redis_server_start_sentinel(redis_server *s, const redis_server *master, const char *dir, const char *name,
                                int timeout_ms, char *err, size_t errlen);
/* The embedded server s died: a new one on its port with its password (empty: no persistence),
 * waited for (up to timeout_ms) until it answers. 0, or -1 + err (the port taken meanwhile). */
int redis_server_restart(redis_server *s, int timeout_ms, char *err, size_t errlen);
/* A server of a control plane spread over machines (a Slurm job's): like the three above, but
 * listening on host:port with the given password (64 hex characters), its master (NULL for a
 * master) at master->host:master->port. A sentinel (name set) or a replica keeps its files in
 * dir. 0 / -1 + err. */
int redis_server_start_on(redis_server *s, const char *host, int port, const char *password, const redis_server *master,
                          const char *dir, const char *name, int timeout_ms, char *err, size_t errlen);
/* SIGTERM, wait up to timeout_ms, then SIGKILL; always reaps the child. */
void redis_server_stop(redis_server *s, int timeout_ms);

/* --- the launcher's private run directory ----------------------------------------------
 * /tmp/deadpool-run-PID-nPIDNS??????, 0700: the embedded Redis's socket, the --redis-ha set's
 * files and the job's redis file (redis_file_write) live there. run_dir_sweep first removes
 * those of launchers that died without cleaning up (kill -9): only directories of this user,
 * made in this pid namespace (PIDNS, its inode: /tmp may be shared by machines or containers
 * whose PIDs are not ours), whose PID is gone; the count. run_dir_remove deletes one (its files, then itself). */
int run_dir_sweep(void);
int run_dir_create(char *dir, size_t len, char *err, size_t errlen);
/* A run directory's name (no parent): its launcher's PID and pid namespace. The last 6
 * characters are mkdtemp's and may be digits: they are never part of the namespace. 0 / -1
 * (not a run directory's name). */
int run_dir_name_parse(const char *name, long *pid, unsigned long *ns);
void run_dir_remove(const char *dir);

#endif
