/* util.c — clocks, logging, JSON escaping, directories, a TCP liveness probe. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double thread_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static _Atomic int64_t wall_offset_ms;

int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + wall_offset_ms;
}

void wall_clock_offset_set(int64_t offset_ms) { wall_offset_ms = offset_ms; }

void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int bound_for_bytes_ms(int base_ms, uint64_t bytes) {
    uint64_t ms = (uint64_t)(base_ms > 0 ? base_ms : 0) + bytes / TRANSFER_FLOOR_BYTES_PER_MS;
    return ms > 3600000 ? 3600000 : (int)ms;
}

void *alloc_huge(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    size_t len = bytes ? (bytes + huge - 1) / huge * huge : huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, len) != 0) return NULL;
    /* Only advice: where THP is off the buffer simply keeps 4 KiB pages. */
    madvise(p, len, MADV_HUGEPAGE);
    return p;
}

void prefault(void *p, size_t len) {
    if (!p || !len) return;
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
#endif
    /* Kernels before 5.14: one write per page (callers treat the buffer as uninitialised). */
    volatile unsigned char *c = p;
    for (size_t off = 0; off < len; off += 4096) c[off] = 0;
    c[len - 1] = 0;
}

/* The role changes when a spare takes a rank while other threads log: guarded. */
static char log_role[64] = "deadpool";
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void log_set_role(const char *role) {
    pthread_mutex_lock(&log_mu);
    snprintf(log_role, sizeof log_role, "%s", role);
    pthread_mutex_unlock(&log_mu);
}

void log_msg(const char *fmt, ...) {
    char line[2048], role[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    memcpy(role, log_role, sizeof role);
    pthread_mutex_unlock(&log_mu);
    fprintf(stderr, "[%s] %s\n", role, line);
}

void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Length of the valid UTF-8 sequence at s (1..4), 0 if the bytes there are not one. */
static int utf8_len(const unsigned char *s) {
    int n = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

void json_escape(const char *s, char *out, size_t len) {
    size_t o = 0;
    for (; *s && o + 7 < len; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { out[o++] = '\\'; out[o++] = (char)ch; }
        else if (ch == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (ch < 0x20) o += (size_t)snprintf(out + o, len - o, "\\u%04x", ch);
        else if (ch < 0x80) out[o++] = (char)ch;
        else {
            /* Valid UTF-8 passes through; a byte that is not (a path in another encoding)
             * becomes the code point of the same number, so every line stays valid JSON. */
            int n = utf8_len((const unsigned char *)s);
            if (n > 0 && o + (size_t)n + 1 < len) { memcpy(out + o, s, (size_t)n); o += (size_t)n; s += n - 1; }
            else if (n > 0) break;
            else o += (size_t)snprintf(out + o, len - o, "\\u%04x", ch);
        }
    }
    out[o] = 0;
}

int mkdir_p(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

int write_file_atomic(const char *path, const struct iovec *parts, int nparts, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC); /* a new file of mode 0600: the job's state is the job's alone */
    if (fd < 0) { snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno)); return -1; }
    for (int p = 0; p < nparts; p++) {
        const char *at = parts[p].iov_base;
        size_t left = parts[p].iov_len;
        while (left > 0) {
            ssize_t w = write(fd, at, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
                close(fd);
                unlink(tmp);
                return -1;
            }
            at += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        snprintf(err, errlen, "%s: fsync/close failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int open_regular(const char *path, char *err, size_t errlen) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is cleared for the reads. */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP) set_err(err, errlen, "%s: is a symbolic link; expected a regular file", path);
        else set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, errlen, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *what = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                           : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket"
                           : S_ISDIR(st.st_mode) ? "a directory" : "not a file";
        set_err(err, errlen, "%s: is %s; expected a regular file", path, what);
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        set_err(err, errlen, "%s: fcntl: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

FILE *fopen_regular(const char *path, char *err, size_t errlen) {
    int fd = open_regular(path, err, errlen);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (fd >= 0 && !f) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int dir_is_private(const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
        set_err(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        set_err(err, errlen, "%s: is a symbolic link; give the directory itself (no link is followed in it)", dir);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_err(err, errlen, "%s: is not a directory", dir);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        set_err(err, errlen, "%s: owned by uid %u, not by this user (uid %u): another user could have planted "
                "links in it; refused", dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        set_err(err, errlen, "%s: writable by %s (mode %04o): another user could plant links in it; refused "
                "(chmod go-w it)", dir, (st.st_mode & S_IWOTH) ? "every user" : "its group",
                (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
}

void tcp_probe_many(const char *endpoints, size_t len, int n, int timeout_ms, int *state) {
    struct pollfd *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    for (int i = 0; i < n; i++) {
        state[i] = -1;
        if (p) p[i].fd = -1;
    }
    if (!p) return;
    for (int i = 0; i < n; i++) {
        char host[300];
        snprintf(host, sizeof host, "%s", endpoints + (size_t)i * len);
        char *colon = strrchr(host, ':');
        if (!colon) continue;
        *colon = 0;
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
        if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai) continue;
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0) {
            int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
            if (rc == 0) state[i] = 1;
            else if (errno == ECONNREFUSED) state[i] = 0;
            if (rc == 0 || errno != EINPROGRESS) close(fd);
            else p[i] = (struct pollfd){.fd = fd, .events = POLLOUT};
        }
        freeaddrinfo(ai);
    }
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        int waiting = 0;
        for (int i = 0; i < n; i++) waiting += p[i].fd >= 0;
        int left = (int)(deadline - now_ms());
        if (!waiting || left <= 0 || poll(p, (nfds_t)n, left) < 0) break;
        for (int i = 0; i < n; i++) {
            if (p[i].fd < 0 || !p[i].revents) continue;
            int e = 0;
            socklen_t el = sizeof e;
            getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &e, &el);
            state[i] = e == 0 ? 1 : e == ECONNREFUSED ? 0 : -1;
            close(p[i].fd);
            p[i].fd = -1;
        }
    }
    for (int i = 0; i < n; i++)
        if (p[i].fd >= 0) close(p[i].fd);
    free(p);
}

int name_char(int ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
           ch == '-';
}

int private_line_write(const char *path, const char *line, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int ok = fd >= 0 && dprintf(fd, "%s\n", line) == (int)strlen(line) + 1;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (!ok) {
        set_err(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}

int private_line_read(const char *path, const char *what, char *buf, size_t len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "%s: %s", path, errno == ELOOP ? "is a symbolic link; refused" : strerror(errno));
        return -1;
    }
    struct stat st;
    int bad = 1;
    if (fstat(fd, &st) != 0) set_err(err, errlen, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) set_err(err, errlen, "%s: not a regular file", path);
    else if (st.st_uid != geteuid())
        set_err(err, errlen, "%s: owned by uid %u, not by this user (uid %u): refused", path, (unsigned)st.st_uid,
                (unsigned)geteuid());
    else if (st.st_mode & 077)
        set_err(err, errlen, "%s: mode %04o lets other users read or change it: expected 0600 (chmod 600 %s)", path,
                (unsigned)(st.st_mode & 07777), path);
    else if (st.st_size <= 0 || (size_t)st.st_size >= len)
        set_err(err, errlen, "%s: expected one line with %s (1 to %zu bytes), found %lld bytes", path, what, len - 1,
                (long long)st.st_size);
    else bad = 0;
    ssize_t got = 0;
    if (!bad) {
        got = read(fd, buf, len - 1);
        if (got <= 0) {
            set_err(err, errlen, "%s: cannot read: %s", path, got < 0 ? strerror(errno) : "empty");
            bad = 1;
        }
    }
    close(fd);
    if (bad) return -1;
    buf[got] = 0;
    while (got > 0 && isspace((unsigned char)buf[got - 1])) buf[--got] = 0;
    if (!got || strpbrk(buf, "\r\n")) {
        explicit_bzero(buf, len);
        set_err(err, errlen, "%s: expected one line with %s", path, what);
        return -1;
    }
    return 0;
}
