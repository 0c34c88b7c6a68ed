/* util.h — clocks, logging and JSON string escaping shared by every process role. */
#ifndef DEADPOOL_UTIL_H
#define DEADPOOL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

double now_ms(void);       /* monotonic clock, milliseconds */
double thread_cpu_ms(void); /* CPU time of the calling thread, milliseconds */
int64_t wall_ms(void);     /* the job's clock, milliseconds since the epoch (shared across hosts) */
/* wall_ms = this machine's realtime clock + offset_ms: every process of a job sets the offset
 * to its control plane's clock (ctl_clock_offset), so that times taken on different machines
 * (a failure on one, its recovery on another) are on one clock. */
void wall_clock_offset_set(int64_t offset_ms);
void sleep_ms(int ms);

/* The slowest rate a transfer between the job's processes is assumed to keep (bytes per ms:
 * 20 MB/s, far below loopback or any data-centre link even on a loaded machine). */
#define TRANSFER_FLOOR_BYTES_PER_MS 20000
/* base_ms plus the time `bytes` take at the floor rate, capped at one hour: the bound on a
 * wait that moves `bytes`, so that a bigger model never outlasts it. */
int bound_for_bytes_ms(int base_ms, uint64_t bytes);

/* "[deadpool <role>] message" on stderr, one line. */
void log_set_role(const char *role);
void log_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Formats an error message into err (NULL or empty err: ignored). */
void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Escapes s as the inside of a JSON string into out (always NUL-terminated). */
void json_escape(const char *s, char *out, size_t len);
/* 1 if ch may be part of a name that goes into Redis keys and patterns (jobs, machines):
 * [A-Za-z0-9._-]. */
int name_char(int ch);

/* A big buffer that copies stream through (model, optimizer state, snapshot slots): 2 MiB
 * aligned and marked for transparent huge pages, so every walk over it, process_vm_readv's
 * page pinning above all, touches 512x fewer page-table entries. Not zeroed; free() releases
 * it. NULL without memory. */
void *alloc_huge(size_t bytes);

/* Faults in every page of [p, p+len) now, so that the first writes to it do not: a buffer
 * whose first use lands in a timed loop is prefaulted by a background thread ahead of it. */
void prefault(void *p, size_t len);

struct iovec;
/* Writes the parts to path atomically: a new file path.tmp.XXXXXX (mkostemp: O_EXCL, so no
 * link planted at a predictable name is followed; mode 0600), fsync, rename (which replaces a
 * link at path, never follows it). A reader sees the old file or the whole new one, never a
 * torn one. 0 / -1 + err. */
int write_file_atomic(const char *path, const struct iovec *parts, int nparts, char *err, size_t errlen);

/* Opens path for reading only if it is a regular file, following no symbolic link in its last
 * component: a FIFO, a device or a link (to /dev/zero, say) is refused at once, never read
 * from (a read could block or never end). fd (O_CLOEXEC, blocking), or -1 + err naming the
 * file and what it is. */
int open_regular(const char *path, char *err, size_t errlen);
/* The same as a stdio stream, for reading. */
FILE *fopen_regular(const char *path, char *err, size_t errlen);

/* 0 when dir is a directory (not a symbolic link) owned by this process's user and writable by
 * no one else, so that nobody else can plant a link or a file in it; -1 + err naming the
 * directory and the problem (its owner, its mode, what it is instead). */
int dir_is_private(const char *dir, char *err, size_t errlen);

/* A secret's file (a password, the job's secret): one line, a regular file of this user's that
 * nobody else can read or change (mode 0600 or stricter), opened following no link.
 * private_line_read: that line (trailing space removed) into buf; -1 + err naming the file and
 * the problem (its owner, its mode, its size, several lines), `what` naming what the line is.
 * private_line_write: creates path (O_EXCL, 0600) holding line + newline. 0 / -1 + err. */
int private_line_read(const char *path, const char *what, char *buf, size_t len, char *err, size_t errlen);
int private_line_write(const char *path, const char *line, char *err, size_t errlen);

/* Creates dir and its parents (mkdir -p). 0 / -1 with errno. */
int mkdir_p(const char *dir);
/* Connects to each "HOST:PORT" in endpoints (n strings of stride len) at once and waits up to
 * timeout_ms: state[i] = 1 something listens there, 0 refused (nothing listens: on a live
 * kernel, the process that listened is gone), -1 no answer within the bound or no address. */
void tcp_probe_many(const char *endpoints, size_t len, int n, int timeout_ms, int *state);

#endif
