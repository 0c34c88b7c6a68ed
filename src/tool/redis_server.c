/* redis_server.c — the embedded redis-server that `deadpool run` starts when no --redis URL
 * is given: a child process protected by a random password, with no persistence. For a
 * one-machine job it listens on a unix socket only (port 0), in the launcher's private 0700
 * directory with unixsocketperm 700: no other user can open a connection at all, so nobody can
 * fill its client limit (maxclients) with connections that never authenticate. The --redis-ha
 * set (and --inject netdown, whose rank must reach it over a link that can be cut) stays on a
 * free loopback port: Sentinel and replication address a server by IP and port. The configuration (and so the password) reaches the server through a pipe
 * on its stdin ("redis-server -"), never through the command line, where `ps` would show it.
 * The child is tied to its parent with PR_SET_PDEATHSIG so it cannot outlive the launcher. */
#include "control.h"
#include "redis_server.h"
#include "redis_connect.h"
#include "secret.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_ATTEMPTS 4        /* a port picked free can be taken before redis binds it */
#define PING_POLL_MS 10
#define PING_CONNECT_MS 200
#define EXIT_EXEC_FAILED 127    /* the shell's convention for "command not found" */

/* A port the kernel considers free right now on 127.0.0.1 (bind to port 0, read it back).
 * Another process may take it before redis binds it; the caller retries on that race. */
static int pick_free_port(char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_err(err, errlen, "redis-server: socket: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        set_err(err, errlen, "redis-server: bind 127.0.0.1:0: %s", strerror(errno));
    else if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        set_err(err, errlen, "redis-server: getsockname: %s", strerror(errno));
    else
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* 64 hex characters from 32 bytes of the kernel's CSPRNG. */
static int make_password(char out[65], char *err, size_t errlen) {
    unsigned char raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            set_err(err, errlen, "redis-server: getrandom: %s", strerror(errno));
            return -1;
        }
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[64] = '\0';
    memset(raw, 0, sizeof raw);
    return 0;
}

/* The passwords of the two users a server on a TCP port has besides the job's own (the
 * default user, `requirepass`): replication and Sentinel, each allowed only the commands it
 * needs. Sentinels and replicas reconnect to a dead master's port, where another local user
 * may be listening (issue 34 item 3): what they send there is one of these, never the
 * password that reads and writes the job's keys. Derived from it (one-way), so every server,
 * replica and sentinel of the set computes the same ones. */
#define REPL_USER "dp-repl"
#define SENTINEL_USER "dp-sentinel"
static void role_password(const char *password, const char *role, char out[JOB_KEY_HEX_LEN + 1]) {
    if (job_secret_hash(role, "redis-user", password, out) != 0) out[0] = 0;
}

/* A pipe whose read end already holds the whole configuration, write end closed. Writing it
 * before fork means the write can neither block nor raise SIGPIPE if the child dies early
 * (the config is far below the pipe capacity); redis reads its stdin up to EOF. */
static int config_pipe(const char *host, int port, const char *sock, const char *password, const char *extra, char *err,
                       size_t errlen) {
    char conf[2048], listen[1024], repl[JOB_KEY_HEX_LEN + 1], sent[JOB_KEY_HEX_LEN + 1];
    role_password(password, REPL_USER, repl);
    role_password(password, SENTINEL_USER, sent);
    if (sock[0]) /* no TCP at all: only this user can open the socket (0700, in a 0700 directory) */
        snprintf(listen, sizeof listen, "port 0\nunixsocket %s\nunixsocketperm 700\n", sock);
    else /* the commands are those Redis's Sentinel documentation lists for each role */
        snprintf(listen, sizeof listen,
                 "port %d\nbind %s\n"
                 "user " REPL_USER " on >%s +psync +replconf +ping\n"
                 "user " SENTINEL_USER " on >%s allchannels +multi +slaveof +replicaof +ping +exec +subscribe "
                 "+config|rewrite +role +publish +info +client|setname +client|kill +script|kill\n"
                 "masteruser " REPL_USER "\nmasterauth %s\n",
                 port, host, repl, sent, repl);
    explicit_bzero(repl, sizeof repl);
    explicit_bzero(sent, sizeof sent);
    int n = snprintf(conf, sizeof conf,
                     "%s"
                     "requirepass %s\n"
                     "save \"\"\n"
                     "appendonly no\n"
                     "protected-mode yes\n"
                     "daemonize no\n"
                     "loglevel warning\n"
                     "logfile \"\"\n"
                     "repl-diskless-sync-delay 0\n%s",
                     listen, password, extra ? extra : "");
    explicit_bzero(listen, sizeof listen);
    if (n < 0 || (size_t)n >= sizeof conf) {
        set_err(err, errlen, "redis-server: configuration too long");
        return -1;
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        set_err(err, errlen, "redis-server: pipe: %s", strerror(errno));
        return -1;
    }
    ssize_t w;
    do {
        w = write(fds[1], conf, (size_t)n);
    } while (w < 0 && errno == EINTR);
    memset(conf, 0, sizeof conf);
    close(fds[1]);
    if (w != n) {
        set_err(err, errlen, "redis-server: writing the configuration: %s",
                w < 0 ? strerror(errno) : "short write");
        close(fds[0]);
        return -1;
    }
    return fds[0];
}

/* In the child, between fork and exec: only async-signal-safe calls, then exec. */
static void exec_redis_child(int config_fd, pid_t parent, const char *sentinel_conf) {
    /* Die with the parent. Note that Linux delivers this when the *thread* that forked exits,
     * so start the server from a thread that lives as long as the job. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(EXIT_EXEC_FAILED - 1); /* parent already gone */
    /* Own process group: a Ctrl-C in the terminal reaches the launcher only, which then
     * stops the server itself after draining events. */
    setpgid(0, 0);
    /* A blocked or ignored SIGTERM would survive exec and make the server unkillable by
     * redis_server_stop's first signal. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    /* Whatever the server writes (a sentinel rewriting its configuration, with the password in
     * it; a replica's synchronisation file) is this user's alone. */
    umask(077);
    if (dup2(config_fd, STDIN_FILENO) < 0) _exit(EXIT_EXEC_FAILED - 1);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO); /* startup warnings are noise for a job */
    /* Do not leak the launcher's sockets and files into the server. */
    close_range(3, ~0U, 0);
    char *const argv[] = {"redis-server", "-", NULL};
    /* A sentinel keeps its state in its configuration file: it needs one it may rewrite. */
    char *const sentinel_argv[] = {"redis-server", (char *)sentinel_conf, "--sentinel", NULL};
    execvp(argv[0], sentinel_conf ? sentinel_argv : argv);
    _exit(EXIT_EXEC_FAILED);
}

/* Reaps the child if it exited: 1 and *status when it did, 0 while it runs, -1 on error. */
static int child_exited(pid_t pid, int *status) {
    pid_t r;
    do {
        r = waitpid(pid, status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid) return 1;
    return r == 0 ? 0 : -1;
}

/* One AUTH + PING attempt (sock "": on host:port). 1 on PONG, 0 when not ready yet. */
static int answers_ping(const char *host, int port, const char *sock, const char *password) {
    struct timeval tv = {.tv_sec = 0, .tv_usec = PING_CONNECT_MS * 1000};
    redisContext *rc = dp_redis_connect(sock[0] ? sock : host, port, tv);
    if (!rc) return 0;
    int ok = 0;
    if (rc->err == 0 && redisSetTimeout(rc, tv) == REDIS_OK) {
        redisReply *r = redisCommand(rc, "AUTH %s", password);
        int authed = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (authed) {
            r = redisCommand(rc, "PING");
            ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
            if (r) freeReplyObject(r);
        }
    }
    redisFree(rc);
    return ok;
}

static void kill_and_reap(pid_t pid) {
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

typedef enum { WAIT_READY, WAIT_EXITED, WAIT_FAILED } wait_result;

/* Polls until the server answers PING, exits, or the deadline passes. On WAIT_EXITED the
 * child has been reaped and *status holds its wait status. */
static wait_result wait_until_ready(pid_t pid, const char *host, int port, const char *sock, const char *password,
                                    double deadline,
                                    int *status, char *err, size_t errlen) {
    for (;;) {
        int exited = child_exited(pid, status);
        if (exited == 1) return WAIT_EXITED;
        if (exited < 0) {
            set_err(err, errlen, "redis-server: waitpid: %s (is SIGCHLD ignored?)", strerror(errno));
            kill_and_reap(pid);
            return WAIT_FAILED;
        }
        if (answers_ping(host, port, sock, password)) return WAIT_READY;
        if (now_ms() >= deadline) {
            if (sock[0]) set_err(err, errlen, "redis-server: no answer to PING on %s within the timeout", sock);
            else set_err(err, errlen, "redis-server: no answer to PING on %s:%d within the timeout", host, port);
            kill_and_reap(pid);
            return WAIT_FAILED;
        }
        sleep_ms(PING_POLL_MS);
    }
}

/* Whether another socket holds host:port (the bind redis-server would do, SO_REUSEADDR as it
 * sets): tells "port taken" from "configuration rejected" in the error. */
static int port_taken(const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host && host[0] ? host : "127.0.0.1", &a.sin_addr) != 1) return 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int taken = bind(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == EADDRINUSE;
    close(fd);
    return taken;
}

/* Describes how the child ended, for the error message. */
static void describe_exit(int status, const char *host, int port, char *err, size_t errlen) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_EXEC_FAILED)
        set_err(err, errlen, "redis-server not found: install the Debian package redis-server");
    else if (WIFEXITED(status) && port > 0 && port_taken(host, port))
        set_err(err, errlen, "redis-server exited with status %d while starting: port %s:%d is taken by another process",
                WEXITSTATUS(status), host && host[0] ? host : "127.0.0.1", port);
    else if (WIFEXITED(status))
        set_err(err, errlen, "redis-server exited with status %d while starting on port %d "
                "(configuration rejected, or the port was taken and freed again: its log went to /dev/null)",
                WEXITSTATUS(status), port);
    else if (WIFSIGNALED(status))
        set_err(err, errlen, "redis-server was killed by signal %d while starting", WTERMSIG(status));
    else
        set_err(err, errlen, "redis-server stopped while starting");
}

/* Writes a sentinel's configuration file (0600, in a 0700 directory of its own): the
 * master's password is in it. 0 / -1. */
static int write_sentinel_conf(const char *path, const char *host, int port, const char *password, const redis_server *master,
                               const char *name, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        set_err(err, errlen, "redis-sentinel: %s: %s", path, strerror(errno));
        return -1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    /* Fail over one second after the master stops answering: well inside the time the
     * processes wait for the control plane before they give up (job_control_outage_ms). */
    char sent[JOB_KEY_HEX_LEN + 1];
    role_password(password, SENTINEL_USER, sent);
    fprintf(f, "port %d\nbind %s\nrequirepass %s\ndaemonize no\nloglevel warning\nlogfile \"\"\ndir %s\n"
               "sentinel monitor %s %s %d 2\nsentinel auth-user %s " SENTINEL_USER "\nsentinel auth-pass %s %s\n"
               "sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 3000\n"
               "sentinel parallel-syncs %s 1\n",
            port, host, password, dir, name, master->host[0] ? master->host : "127.0.0.1", master->port, name, name, sent,
            name, name, name);
    explicit_bzero(sent, sizeof sent);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        set_err(err, errlen, "redis-sentinel: writing %s failed", path);
        return -1;
    }
    return 0;
}

static int start_server(redis_server *s, const redis_server *master, const char *dir, const char *name,
                        int timeout_ms, char *err, size_t errlen, const char *host, int fixed_port, const char *password,
                        int private_socket);

/* A sentinel asks a replica for INFO every 10 s until the master is objectively down, and
 * when it picks the replica to promote it refuses one whose INFO is older than 5 s: so a
 * failover's first attempt can abort ("-failover-abort-no-good-slave") and be tried again only
 * after twice the failover timeout. Asked every second, the replica is always fresh enough
 * (SENTINEL DEBUG, Redis 7; an older sentinel refuses it and keeps its 10 s). */
static void sentinel_tune(const char *host, int port, const char *password) {
    struct timeval tv = {.tv_sec = 0, .tv_usec = PING_CONNECT_MS * 1000};
    redisContext *rc = redisConnectWithTimeout(host, port, tv);
    if (rc && rc->err == 0 && redisSetTimeout(rc, tv) == REDIS_OK) {
        redisReply *r = redisCommand(rc, "AUTH %s", password);
        if (r) freeReplyObject(r);
        r = redisCommand(rc, "SENTINEL DEBUG info-period 1000");
        if (r) freeReplyObject(r);
    }
    if (rc) redisFree(rc);
}

int redis_server_start(redis_server *s, int timeout_ms, char *err, size_t errlen) {
    return start_server(s, NULL, NULL, NULL, timeout_ms, err, errlen, NULL, 0, NULL, 0);
}

int redis_server_start_on(redis_server *s, const char *host, int port, const char *password, const redis_server *master,
                          const char *dir, const char *name, int timeout_ms, char *err, size_t errlen) {
    return start_server(s, master, dir, name, timeout_ms, err, errlen, host, port, password, 0);
}

int redis_server_start_private(redis_server *s, const char *dir, int timeout_ms, char *err, size_t errlen) {
    if (!dir || dir[0] != '/') {
        set_err(err, errlen, "redis-server: the socket's directory must be an absolute path");
        return -1;
    }
    return start_server(s, NULL, dir, NULL, timeout_ms, err, errlen, NULL, 0, NULL, 1);
}

int redis_server_start_replica(redis_server *s, const redis_server *master, const char *dir, int timeout_ms, char *err,
                               size_t errlen) {
    return start_server(s, master, dir, NULL, timeout_ms, err, errlen, NULL, 0, NULL, 0);
}

int redis_server_replica_synced(const redis_server *s, int timeout_ms) {
    double deadline = now_ms() + timeout_ms;
    while (now_ms() < deadline) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = PING_CONNECT_MS * 1000};
        redisContext *rc = redisConnectWithTimeout(s->host[0] ? s->host : "127.0.0.1", s->port, tv);
        int up = 0;
        if (rc && rc->err == 0 && redisSetTimeout(rc, tv) == REDIS_OK) {
            redisReply *r = redisCommand(rc, "AUTH %s", s->password);
            if (r) freeReplyObject(r);
            r = redisCommand(rc, "INFO replication");
            up = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "master_link_status:up") != NULL;
            if (r) freeReplyObject(r);
        }
        if (rc) redisFree(rc);
        if (up) return 0;
        sleep_ms(20);
    }
    return -1;
}

int redis_server_start_sentinel(redis_server *s, const redis_server *master, const char *dir, const char *name,
                                int timeout_ms, char *err, size_t errlen) {
    return start_server(s, master, dir, name, timeout_ms, err, errlen, NULL, 0, NULL, 0);
}

/* master NULL: a master; name NULL: master's replica, its synchronisation file in dir; else a
 * sentinel named `name` with its configuration file in dir. */
static int start_server(redis_server *s, const redis_server *master, const char *dir, const char *name,
                        int timeout_ms, char *err, size_t errlen, const char *host, int fixed_port, const char *password,
                        int private_socket) {
    const char *sentinel_dir = name ? dir : NULL;
    const char *sock_dir = private_socket ? dir : NULL; /* a private master: a unix socket there */
    if (!s) {
        set_err(err, errlen, "redis_server_start: no server struct");
        return -1;
    }
    memset(s, 0, sizeof *s);
    if (timeout_ms <= 0) {
        set_err(err, errlen, "redis_server_start: timeout must be positive (got %d ms)", timeout_ms);
        return -1;
    }
    double deadline = now_ms() + timeout_ms;
    snprintf(s->host, sizeof s->host, "%s", host ? host : "127.0.0.1");
    /* A replica and the sentinels share the master's password: the job has one secret. */
    if (password) snprintf(s->password, sizeof s->password, "%s", password);
    else if (master) snprintf(s->password, sizeof s->password, "%s", master->password);
    else if (make_password(s->password, err, errlen) != 0) return -1;
    const char *mhost = master && master->host[0] ? master->host : "127.0.0.1";

    if (sock_dir) {
        int n = snprintf(s->sock, sizeof s->sock, "%s/redis.sock", sock_dir);
        if (n < 0 || (size_t)n >= sizeof s->sock) {
            set_err(err, errlen, "redis-server: %s/redis.sock: a unix socket's path must be shorter than %zu bytes",
                    sock_dir, sizeof s->sock);
            memset(s->password, 0, sizeof s->password);
            return -1;
        }
        unlink(s->sock); /* a stale socket of a dead server would make redis refuse to start */
    }
    for (int attempt = 0; attempt < (fixed_port || sock_dir ? 1 : START_ATTEMPTS); attempt++) {
        int port = sock_dir ? 0 : fixed_port ? fixed_port : pick_free_port(err, errlen);
        if (port < 0) break;
        char extra[512] = "", conf_path[4200] = "";
        /* The copy a replica receives passes through a file: in the private directory. */
        if (master && !sentinel_dir)
            snprintf(extra, sizeof extra, "replicaof %s %d\nreplica-read-only yes\ndir %s\n", mhost, master->port, dir);
        if (sentinel_dir) {
            snprintf(conf_path, sizeof conf_path, "%s/sentinel-%d.conf", sentinel_dir, port);
            if (write_sentinel_conf(conf_path, s->host, port, s->password, master, name, err, errlen) != 0) break;
        }
        int config_fd = config_pipe(s->host, port, s->sock, s->password, extra, err, errlen);
        memset(extra, 0, sizeof extra);
        if (config_fd < 0) break;
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            set_err(err, errlen, "redis-server: fork: %s", strerror(errno));
            close(config_fd);
            break;
        }
        if (pid == 0) exec_redis_child(config_fd, parent, sentinel_dir ? conf_path : NULL);
        close(config_fd);

        int status = 0;
        wait_result w = wait_until_ready(pid, s->host, port, s->sock, s->password, deadline, &status, err, errlen);
        if (w == WAIT_READY) {
            s->pid = (int)pid;
            s->port = port;
            if (sentinel_dir) sentinel_tune(s->host, port, s->password);
            return 0;
        }
        if (w == WAIT_FAILED) break;
        describe_exit(status, s->host, port, err, errlen);
        /* Exit status 1 is most likely "port already in use" (the race above): retry on a
         * new port. A missing binary or a crash will not get better. */
        if (sock_dir || !WIFEXITED(status) || WEXITSTATUS(status) != 1 || now_ms() >= deadline) break;
    }
    memset(s->password, 0, sizeof s->password);
    return -1;
}

void redis_server_stop(redis_server *s, int timeout_ms) {
    if (!s || s->pid <= 0) return;
    pid_t pid = (pid_t)s->pid;
    int status;
    if (kill(pid, SIGTERM) == 0) {
        double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
        for (;;) {
            int exited = child_exited(pid, &status);
            if (exited != 0) break; /* reaped, or not our child any more (ECHILD) */
            if (now_ms() >= deadline) {
                kill_and_reap(pid);
                break;
            }
            sleep_ms(PING_POLL_MS);
        }
    } else {
        /* Already dead: reap it if it is still our zombie. */
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    s->pid = 0;
    if (s->sock[0]) unlink(s->sock);
    s->sock[0] = 0;
    memset(s->password, 0, sizeof s->password);
}

/* --- the launcher's private run directory ---------------------------------------------- */

#define RUN_DIR_PREFIX "deadpool-run-"
#define RUN_DIR_PARENT "/tmp"

/* Removes the files of a flat directory (through its descriptor: no link is followed, nothing
 * outside it is touched), then the directory. 0 when the directory is gone, -1 when it stays
 * (a server of a dead launcher still writing into it: left for the next sweep). */
static int remove_flat_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    return rmdir(path);
}

/* The pid namespace this process lives in (its inode): a PID names a process only inside it.
 * /tmp may be shared by containers or machines of a test that each have their own. */
static unsigned long pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0;
}

int run_dir_name_parse(const char *name, long *pid, unsigned long *ns) {
    size_t n = strlen(RUN_DIR_PREFIX), len = strlen(name);
    /* PREFIX, PID, "-n", NS, then mkdtemp's 6: parsed up to those 6, which a digit may begin
     * (strtoul would take it into the namespace, and the directory would never be swept) */
    char head[128];
    if (strncmp(name, RUN_DIR_PREFIX, n) != 0 || len < n + 10 || len - 6 >= sizeof head) return -1;
    memcpy(head, name, len - 6);
    head[len - 6] = 0;
    char *end = NULL;
    errno = 0;
    long p = strtol(head + n, &end, 10);
    if (p <= 0 || errno || end == head + n || strncmp(end, "-n", 2) != 0 || end[2] < '0' || end[2] > '9') return -1;
    unsigned long s = strtoul(end + 2, &end, 10);
    if (errno || *end || s == 0) return -1;
    *pid = p;
    *ns = s;
    return 0;
}

int run_dir_sweep(void) {
    unsigned long ns = pid_ns();
    if (!ns) return 0; /* cannot tell whose PIDs the names hold: leave them */
    DIR *d = opendir(RUN_DIR_PARENT);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        unsigned long its_ns;
        if (run_dir_name_parse(e->d_name, &pid, &its_ns) != 0 || its_ns != ns) continue; /* another pid namespace's */
        struct stat st;
        /* ours only (another user's is theirs to clean), a directory and not a link to one */
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its launcher lives */
        char path[600];
        snprintf(path, sizeof path, "%s/%s", RUN_DIR_PARENT, e->d_name);
        if (remove_flat_dir(path) == 0) removed++;
    }
    closedir(d);
    return removed;
}

int run_dir_create(char *dir, size_t len, char *err, size_t errlen) {
    /* deadpool-run-PID-nPIDNS + 6 random characters: run_dir_sweep reads both numbers */
    int n = snprintf(dir, len, "%s/%s%ld-n%luXXXXXX", RUN_DIR_PARENT, RUN_DIR_PREFIX, (long)getpid(), pid_ns());
    if (n < 0 || (size_t)n >= len) {
        set_err(err, errlen, "run directory: path too long");
        return -1;
    }
    if (!mkdtemp(dir)) { /* 0700, a name nobody could guess in advance */
        set_err(err, errlen, "cannot create a private directory in %s: %s", RUN_DIR_PARENT, strerror(errno));
        dir[0] = 0;
        return -1;
    }
    return 0;
}

void run_dir_remove(const char *dir) {
    if (dir && dir[0]) remove_flat_dir(dir);
}

int redis_server_restart(redis_server *s, int timeout_ms, char *err, size_t errlen) {
    if (!s || (s->port <= 0 && !s->sock[0]) || !s->password[0]) {
        set_err(err, errlen, "redis_server_restart: no server to restart");
        return -1;
    }
    double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    for (;;) { /* the dead server's port may linger a moment: retried until the deadline */
        int config_fd = config_pipe(s->host[0] ? s->host : "127.0.0.1", s->port, s->sock, s->password, NULL, err, errlen);
        if (config_fd < 0) return -1;
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            set_err(err, errlen, "redis-server: fork: %s", strerror(errno));
            close(config_fd);
            return -1;
        }
        if (pid == 0) exec_redis_child(config_fd, parent, NULL);
        close(config_fd);
        int status = 0;
        wait_result w = wait_until_ready(pid, s->host[0] ? s->host : "127.0.0.1", s->port, s->sock, s->password, deadline, &status,
                                         err, errlen);
        if (w == WAIT_READY) {
            s->pid = (int)pid;
            return 0;
        }
        if (w == WAIT_FAILED) return -1;
        describe_exit(status, s->host, s->port, err, errlen);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || now_ms() >= deadline) return -1;
        sleep_ms(100);
    }
}
