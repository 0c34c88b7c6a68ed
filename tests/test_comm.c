/* test_comm.c — tests of the Gloo communicator (comm.h) with real processes over loopback TCP.
 *
 * The test starts its own password-protected redis-server on a free loopback port and kills it
 * by pid at exit. Every rank is a forked child that reports through its exit status (and writes
 * measurements into a shared page); the parent waits with a deadline and kills by pid any child
 * that overstays. */
#include "comm.h"
#include "comm_auth.h"
#include "harness.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REDIS_PW "deadpool-test-pw"
#define BIND "127.0.0.1"

static pid_t redis_pid = -1;
static pid_t parent_pid = -1;
static int redis_port = -1;
static comm_store_addr store;
/* The data plane's key of the tests' "job" (comm_key_derive of a fixed secret). */
static unsigned char test_key[COMM_KEY_BYTES];

/* Measurements written by children, read by the parent. */
typedef struct {
    double allreduce16_ms;      /* 16 MiB allreduce, 4 ranks, rank 0's view */
    double kill_at;             /* monotonic seconds when the victim killed itself */
    double detect_ms[8];        /* survivor r: time from the kill to its error */
    int detect_status[8];
    double destroy_ms[8];
    double timeout_elapsed_ms;
    int timeout_status;
    unsigned long mesh_rtt[16];  /* test_rendezvous_16: each rank's store round trips */
    double mesh_create_ms[16];   /* and how long its comm_create took */
    double abort_ms;             /* test_rendezvous_abort: abort key set -> comm_create returned */
    double pushed_at;            /* test_abort_in_flight: when the wake-ups were pushed */
    double left_ms[4];           /* and when each rank's allreduce returned, after that */
    int left_status[4];
    size_t abort_sockets[4];
    int stranger_conns;          /* test_strangers_knock: connections the stranger opened */
    int stranger_closed;         /* ... that the job closed within the bound */
    long stranger_max_bytes;     /* the most bytes one of them received */
    int stranger_hello_only;     /* ... every one received nothing but a HELLO */
    double stranger_create_ms[3];
    int mitm_relayed;            /* test_tampered_frame_refused: the relay carried the connection */
    long mitm_flipped_at;        /* ... and flipped this byte of the dialer's stream (-1: none) */
    int mitm_status[2];
    char mitm_error[2][160];
} shared_t;
static shared_t *sh;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---------------- redis lifecycle ---------------- */

static void stop_redis(void) {
    if (getpid() != parent_pid || redis_pid <= 0) return; /* children inherit atexit: ignore */
    pid_t p = redis_pid;
    redis_pid = -1;
    kill(p, SIGTERM);
    for (int i = 0; i < 200; i++) { /* up to 2 s, then force */
        if (waitpid(p, NULL, WNOHANG) == p) return;
        sleep_ms(10);
    }
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

static void on_fatal_signal(int sig) {
    if (getpid() == parent_pid && redis_pid > 0) kill(redis_pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* 1 when redis answers PING after AUTH. */
static int redis_ready(int port) {
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL) return 0;
    int ok = 0;
    if (!c->err) {
        redisReply *r = redisCommand(c, "AUTH %s", REDIS_PW);
        if (r != NULL) {
            freeReplyObject(r);
            r = redisCommand(c, "PING");
            ok = r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
            if (r != NULL) freeReplyObject(r);
        }
    }
    redisFree(c);
    return ok;
}

/* Starts redis-server with its config on stdin; returns 0 on success, -1 with a message. */
static int start_redis_once(void) {
    int port = free_port();
    if (port <= 0) {
        fprintf(stderr, "test_comm: cannot find a free port\n");
        return -1;
    }
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        dup2(pfd[0], 0);
        close(pfd[0]);
        close(pfd[1]);
        FILE *dn = fopen("/dev/null", "w");
        if (dn != NULL) dup2(fileno(dn), 1);
        execlp("redis-server", "redis-server", "-", (char *)NULL);
        fprintf(stderr, "test_comm: cannot exec redis-server: %s (install the redis-server package)\n",
                strerror(errno));
        _exit(127);
    }
    redis_pid = p;
    close(pfd[0]);
    char conf[256];
    int len = snprintf(conf, sizeof conf,
                       "port %d\nbind 127.0.0.1\nrequirepass %s\nsave \"\"\nappendonly no\n", port, REDIS_PW);
    ssize_t w = write(pfd[1], conf, (size_t)len);
    close(pfd[1]);
    if (w != len) fprintf(stderr, "test_comm: short write of the redis config\n");
    double deadline = now_s() + 5.0;
    while (now_s() < deadline) {
        int st;
        if (waitpid(p, &st, WNOHANG) == p) {
            redis_pid = -1;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
                fprintf(stderr, "test_comm: redis-server is not installed (apt-get install redis-server)\n");
            else
                fprintf(stderr, "test_comm: redis-server exited early (status 0x%x)\n", st);
            return -1;
        }
        if (redis_ready(port)) {
            redis_port = port;
            return 0;
        }
        sleep_ms(20);
    }
    fprintf(stderr, "test_comm: redis-server did not answer within 5 s\n");
    stop_redis();
    return -1;
}

static int start_redis(void) {
    for (int attempt = 0; attempt < 3; attempt++) /* the free port may be taken in between */
        if (start_redis_once() == 0) return 0;
    return -1;
}

/* ---------------- child processes ---------------- */

typedef void (*child_fn)(int rank, const char *prefix, int size);

/* Forks a child running fn(rank, prefix, size); the child exits 0 iff all its checks passed. */
static pid_t spawn(child_fn fn, int rank, const char *prefix, int size) {
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the test */
        alarm(25);                        /* and never hangs past 25 s */
        signal(SIGPIPE, SIG_DFL);         /* comm_create itself must protect against SIGPIPE */
        th_failed_checks = 0;
        fn(rank, prefix, size);
        fflush(stdout);
        fflush(stderr);
        _exit(th_failed_checks ? 1 : 0);
    }
    return p;
}

/* Waits for every child up to timeout_s, kills overstayers by pid; CHECKs each exit status. */
static void wait_children(pid_t *pids, int n, double timeout_s, const char *what) {
    double deadline = now_s() + timeout_s;
    int left = n;
    int status[16];
    int done[16] = {0};
    while (left > 0 && now_s() < deadline) {
        for (int i = 0; i < n; i++) {
            if (done[i] || pids[i] <= 0) {
                if (!done[i]) {
                    done[i] = 1;
                    status[i] = -1;
                    left--;
                }
                continue;
            }
            if (waitpid(pids[i], &status[i], WNOHANG) == pids[i]) {
                done[i] = 1;
                left--;
            }
        }
        if (left > 0) sleep_ms(5);
    }
    for (int i = 0; i < n; i++) {
        if (!done[i]) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &status[i], 0);
            CHECK(0, "%s: child %d (pid %d) still running after %.0f s, killed", what, i, (int)pids[i], timeout_s);
            continue;
        }
        CHECK(status[i] != -1, "%s: fork of child %d failed", what, i);
        if (status[i] == -1) continue;
        CHECK(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0, "%s: child %d %s %d", what, i,
              WIFEXITED(status[i]) ? "exited with" : "killed by signal",
              WIFEXITED(status[i]) ? WEXITSTATUS(status[i]) : WTERMSIG(status[i]));
    }
}

static comm_t *create_or_fail(const char *prefix, int rank, int size, int timeout_ms) {
    char err[512];
    comm_t *c = comm_create(&store, prefix, rank, size, BIND, timeout_ms, err, sizeof err);
    CHECK(c != NULL, "rank %d: comm_create(%s) failed: %s", rank, prefix, err);
    return c;
}

/* Deterministic pseudo-random floats in [-1, 1) per (rank, seed). */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static void fill_random(float *x, size_t n, int rank, uint64_t seed) {
    uint64_t s = seed * 1000003u + (uint64_t)rank;
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(splitmix(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---------------- test bodies (run in children) ---------------- */

#define N_PATTERN 1000003u
#define N_BIG (4u * 1024u * 1024u) /* 16 MiB of floats */

static void rank_collectives(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    CHECK(comm_rank(c) == r && comm_size(c) == size, "rank/size %d/%d", comm_rank(c), comm_size(c));
    /* Gloo writes with writev(2): a write to a dead peer must not kill us with SIGPIPE. */
    struct sigaction sa;
    CHECK(sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN, "comm_create left SIGPIPE fatal");

    /* 1. Exact sums of an integer pattern, at sizes that do not divide evenly (and n < size). */
    static const size_t sizes[] = {1, 3, 5, 1000, N_PATTERN};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) b[i] = (float)((r + 1) * (int)(i % 1000) + r);
        comm_status s = comm_allreduce_sum(c, b, n, 10000);
        CHECK(s == COMM_OK, "allreduce n=%zu: %s (%s)", n, comm_status_str(s), comm_last_error(c));
        size_t bad = 0;
        int tot = size * (size + 1) / 2, rs = size * (size - 1) / 2;
        for (size_t i = 0; i < n; i++)
            if (b[i] != (float)(tot * (int)(i % 1000) + rs)) bad++;
        CHECK(bad == 0, "allreduce n=%zu: %zu wrong sums (b[0]=%g)", n, bad, (double)b[0]);
        free(b);
    }

    /* 2. Random floats: bit-identical across two repetitions and across ranks, close to the
     * sum computed locally in double. Also times a 16 MiB allreduce. */
    size_t n = N_BIG;
    float *a1 = malloc(n * sizeof *a1), *a2 = malloc(n * sizeof *a2), *ref = malloc(n * sizeof *ref);
    fill_random(a1, n, r, 7);
    memcpy(a2, a1, n * sizeof *a1);
    comm_barrier(c, 10000);
    double t0 = now_s();
    comm_status s1 = comm_allreduce_sum(c, a1, n, 10000);
    double t1 = now_s();
    comm_status s2 = comm_allreduce_sum(c, a2, n, 10000);
    CHECK(s1 == COMM_OK && s2 == COMM_OK, "random allreduce: %s / %s", comm_status_str(s1), comm_status_str(s2));
    if (r == 0) sh->allreduce16_ms = (t1 - t0) * 1e3;
    CHECK(memcmp(a1, a2, n * sizeof *a1) == 0, "allreduce not bit-identical across repetitions");
    /* rank 0's result to all (16 MiB broadcast) and compare bits */
    memcpy(ref, a1, n * sizeof *a1);
    comm_status sb = comm_broadcast(c, ref, n * sizeof *ref, 0, 10000);
    CHECK(sb == COMM_OK, "broadcast of result: %s", comm_status_str(sb));
    CHECK(memcmp(a1, ref, n * sizeof *a1) == 0, "rank %d result differs bitwise from rank 0's", r);
    {
        double *exact = calloc(n, sizeof *exact);
        float *tmp = malloc(n * sizeof *tmp);
        for (int q = 0; q < size; q++) {
            fill_random(tmp, n, q, 7);
            for (size_t i = 0; i < n; i++) exact[i] += tmp[i];
        }
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (fabs((double)a1[i] - exact[i]) > 1e-5) bad++;
        CHECK(bad == 0, "random allreduce: %zu sums off the exact value", bad);
        free(exact);
        free(tmp);
    }
    free(a1);
    free(a2);
    free(ref);

    /* 3. Allgather, aliased (in == out + rank*n) and with a separate input. */
    size_t m = 1001;
    float *out = malloc((size_t)size * m * sizeof *out);
    for (size_t i = 0; i < (size_t)size * m; i++) out[i] = -1.0f;
    for (size_t i = 0; i < m; i++) out[(size_t)r * m + i] = (float)(r * 10000 + (int)i);
    comm_status s = comm_allgather(c, out + (size_t)r * m, out, m, 10000);
    CHECK(s == COMM_OK, "aliased allgather: %s (%s)", comm_status_str(s), comm_last_error(c));
    size_t bad = 0;
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < m; i++)
            if (out[(size_t)q * m + i] != (float)(q * 10000 + (int)i)) bad++;
    CHECK(bad == 0, "aliased allgather: %zu wrong elements", bad);
    float in[7];
    for (int i = 0; i < 7; i++) in[i] = (float)(r * 100 + i);
    memset(out, 0, (size_t)size * 7 * sizeof *out);
    s = comm_allgather(c, in, out, 7, 10000);
    CHECK(s == COMM_OK, "allgather: %s", comm_status_str(s));
    bad = 0;
    for (int q = 0; q < size; q++)
        for (int i = 0; i < 7; i++)
            if (out[q * 7 + i] != (float)(q * 100 + i)) bad++;
    CHECK(bad == 0 && in[0] == (float)(r * 100), "allgather: %zu wrong elements", bad);
    free(out);

    /* 4. Broadcast of an odd number of bytes from a non-zero root. */
    unsigned char bytes[1237];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = r == 2 ? (unsigned char)(i * 7 + 3) : 0;
    s = comm_broadcast(c, bytes, sizeof bytes, 2, 10000);
    CHECK(s == COMM_OK, "broadcast: %s", comm_status_str(s));
    bad = 0;
    for (size_t i = 0; i < sizeof bytes; i++)
        if (bytes[i] != (unsigned char)(i * 7 + 3)) bad++;
    CHECK(bad == 0, "broadcast: %zu wrong bytes", bad);

    /* 5. Barrier really waits: the last rank arrives 300 ms late. */
    s = comm_barrier(c, 10000);
    CHECK(s == COMM_OK, "barrier: %s", comm_status_str(s));
    if (r == size - 1) sleep_ms(300);
    double b0 = now_s();
    s = comm_barrier(c, 10000);
    double waited = (now_s() - b0) * 1e3;
    CHECK(s == COMM_OK, "barrier: %s", comm_status_str(s));
    if (r != size - 1) CHECK(waited > 250, "rank %d left the barrier after %.0f ms, before the late rank", r, waited);

    /* 6. Invalid arguments are refused without breaking the communicator. */
    CHECK(comm_broadcast(c, bytes, 4, size, 1000) == COMM_ERR_INVALID, "bad root accepted");
    CHECK(comm_allreduce_sum(c, NULL, 4, 1000) == COMM_ERR_INVALID, "NULL buffer accepted");
    float one = 1.0f;
    s = comm_allreduce_sum(c, &one, 1, 10000);
    CHECK(s == COMM_OK && one == (float)size, "allreduce after invalid calls: %s, %g", comm_status_str(s), (double)one);
    CHECK(strcmp(comm_last_error(c), "") == 0, "last_error set without error: %s", comm_last_error(c));
    comm_destroy(c);
}

static void test_collectives_4ranks(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-coll", (int)getpid());
    pid_t pids[4];
    for (int r = 0; r < 4; r++) pids[r] = spawn(rank_collectives, r, prefix, 4);
    wait_children(pids, 4, 25, "collectives");
    printf("# 16 MiB allreduce, 4 ranks, loopback: %.1f ms\n", sh->allreduce16_ms);
}

/* The mean over 3 ranks (1/3 is not exact in float): the sum of the same ring times
 * 1.0f / 3, bit for bit, the same on every rank; a loss appended to the gradients is averaged
 * in the same call. */
static void rank_mean(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    enum { N = 1001 };
    float *mean = malloc((N + 1) * sizeof *mean), *sum = malloc((N + 1) * sizeof *sum);
    fill_random(mean, N, r, 11);
    mean[N] = 0.25f * (float)(r + 1); /* this rank's loss */
    memcpy(sum, mean, (N + 1) * sizeof *sum);
    comm_status s1 = comm_allreduce_sum(c, sum, N + 1, 10000), s2 = comm_allreduce_mean(c, mean, N + 1, 10000);
    CHECK(s1 == COMM_OK && s2 == COMM_OK, "allreduce: %s / %s", comm_status_str(s1), comm_status_str(s2));
    const float inv = 1.0f / (float)size;
    size_t bad = 0;
    for (size_t i = 0; i <= N; i++) {
        float want = sum[i] * inv;
        if (memcmp(&mean[i], &want, sizeof want) != 0) bad++;
    }
    CHECK(bad == 0, "mean: %zu elements differ from sum * (1.0f / %d)", bad, size);
    CHECK(fabsf(mean[N] - 0.5f) < 1e-6f, "mean loss %g, expected 0.5", (double)mean[N]);
    memcpy(sum, mean, (N + 1) * sizeof *sum);
    CHECK(comm_broadcast(c, sum, (N + 1) * sizeof *sum, 0, 10000) == COMM_OK, "broadcast");
    CHECK(memcmp(sum, mean, (N + 1) * sizeof *sum) == 0, "rank %d's mean differs bitwise from rank 0's", r);
    CHECK(comm_allreduce_mean(c, NULL, 4, 1000) == COMM_ERR_INVALID, "NULL buffer accepted");
    free(mean);
    free(sum);
    comm_destroy(c);
}

static void test_allreduce_mean_3ranks(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-mean", (int)getpid());
    pid_t pids[3];
    for (int r = 0; r < 3; r++) pids[r] = spawn(rank_mean, r, prefix, 3);
    wait_children(pids, 3, 25, "mean");
}

/* comm_allreduce over every element type and reduction: exact where the arithmetic is
 * (integers, max/min, small integers in float), the same bits on every rank always. */
static uint16_t to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); } /* exact values only */
static float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static void rank_typed(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    enum { N = 777 };
    static const char *const tn[] = {"f32", "f64", "bf16", "i64"}, *const on[] = {"sum", "mean", "max", "min"};
    for (int t = COMM_F32; t <= COMM_I64; t++)
        for (int op = COMM_SUM; op <= COMM_MIN; op++) {
            size_t es = comm_dtype_size((comm_dtype)t);
            unsigned char *buf = malloc(N * es), *copy = malloc(N * es);
            size_t bad = 0;
            for (int i = 0; i < N; i++) { /* element i of rank r: (i % 13) - 6 + 2 r (exact in every type) */
                double v = (double)(i % 13 - 6 + 2 * r);
                if (t == COMM_F32) ((float *)buf)[i] = (float)v;
                else if (t == COMM_F64) ((double *)buf)[i] = v;
                else if (t == COMM_BF16) ((uint16_t *)buf)[i] = to_bf16((float)v);
                else ((int64_t *)buf)[i] = (int64_t)v;
            }
            comm_status st = comm_allreduce(c, buf, N, (comm_dtype)t, (comm_op)op, 10000);
            CHECK(st == COMM_OK, "%s %s: %s", tn[t], on[op], comm_status_str(st));
            for (int i = 0; i < N; i++) {
                double base = (double)(i % 13 - 6), sum = size * base + (double)(size * (size - 1)), want;
                want = op == COMM_SUM ? sum : op == COMM_MAX ? base + 2 * (size - 1) : op == COMM_MIN ? base : sum / size;
                if (op == COMM_MEAN && t == COMM_I64) want = (double)((int64_t)sum / size);
                double got = t == COMM_F32 ? ((float *)buf)[i] : t == COMM_F64 ? ((double *)buf)[i]
                           : t == COMM_BF16 ? from_bf16(((uint16_t *)buf)[i]) : (double)((int64_t *)buf)[i];
                if (op == COMM_MEAN && t != COMM_I64 ? fabs(got - want) > 1e-2 * (fabs(want) + 1) : got != want) bad++;
            }
            CHECK(bad == 0, "%s %s: %zu of %d elements wrong", tn[t], on[op], bad, N);
            memcpy(copy, buf, N * es);
            CHECK(comm_broadcast(c, copy, N * es, 0, 10000) == COMM_OK, "broadcast");
            CHECK(memcmp(copy, buf, N * es) == 0, "%s %s: rank %d's result differs bitwise from rank 0's", tn[t], on[op], r);
            free(buf);
            free(copy);
        }
    /* A NaN wins max and min; a bad type or op is refused. */
    float x[2] = {r == 1 ? NAN : 1.0f, 2.0f};
    CHECK(comm_allreduce(c, x, 2, COMM_F32, COMM_MAX, 10000) == COMM_OK && isnan(x[0]) && x[1] == 2.0f, "max with a NaN");
    CHECK(comm_allreduce(c, x, 2, (comm_dtype)9, COMM_SUM, 1000) == COMM_ERR_INVALID, "an unknown type is refused");
    CHECK(comm_allreduce(c, x, 2, COMM_F32, (comm_op)9, 1000) == COMM_ERR_INVALID, "an unknown op is refused");
    comm_destroy(c);
}

static void test_allreduce_typed_3ranks(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-typed", (int)getpid());
    pid_t pids[3];
    for (int r = 0; r < 3; r++) pids[r] = spawn(rank_typed, r, prefix, 3);
    wait_children(pids, 3, 40, "typed");
}

/* Peer failure: the last rank dies by SIGKILL while the others are inside an allreduce. The
 * survivors must fail promptly (PEER, or TIMEOUT at worst) and keep the broken communicator
 * for 1.5 s before destroying it: with 4 ranks, survivors that are not ring neighbours of the
 * victim only learn of the death because the failing ranks drop their connections at once. */
#define LINGER_MS 1500
static size_t failure_n;   /* allreduce length during the failure */
static int failure_swap;   /* 1: survivors then form a new epoch with a fresh last rank */

static void rank_failure(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    comm_status s = comm_barrier(c, 10000);
    CHECK(s == COMM_OK, "barrier: %s", comm_status_str(s));
    if (r == size - 1) {
        sleep_ms(200); /* let the survivors block in the allreduce */
        sh->kill_at = now_s();
        kill(getpid(), SIGKILL);
        _exit(3); /* not reached */
    }
    size_t n = failure_n;
    float *b = calloc(n, sizeof *b);
    double t0 = now_s();
    s = comm_allreduce_sum(c, b, n, 5000);
    double t1 = now_s();
    sh->detect_status[r] = (int)s;
    sh->detect_ms[r] = (t1 - sh->kill_at) * 1e3;
    CHECK(s == COMM_ERR_PEER || s == COMM_ERR_TIMEOUT, "rank %d: allreduce with a dead peer returned %s", r,
          comm_status_str(s));
    CHECK(t1 - t0 < 5.0 + 2.0, "rank %d: allreduce took %.2f s with timeout 5 s", r, t1 - t0);
    CHECK(sh->detect_ms[r] < LINGER_MS - 500, "rank %d: learned of the death only after %.0f ms", r,
          sh->detect_ms[r]);
    CHECK(strlen(comm_last_error(c)) > 0, "rank %d: no error message", r);
    fprintf(stderr, "# size %d, rank %d: %s after %.0f ms: %s\n", size, r, comm_status_str(s), sh->detect_ms[r],
            comm_last_error(c));
    /* broken: every later call fails at once with the same class */
    double t2 = now_s();
    comm_status s2 = comm_barrier(c, 5000);
    comm_status s3 = comm_allreduce_sum(c, b, n, 5000);
    CHECK(s2 == s && s3 == s, "rank %d: broken communicator returned %s/%s", r, comm_status_str(s2), comm_status_str(s3));
    CHECK(now_s() - t2 < 0.05, "rank %d: calls on a broken communicator took %.3f s", r, now_s() - t2);
    sleep_ms(LINGER_MS);
    double t3 = now_s();
    comm_destroy(c);
    sh->destroy_ms[r] = (now_s() - t3) * 1e3;
    CHECK(now_s() - t3 < 2.0, "rank %d: comm_destroy took %.2f s", r, now_s() - t3);

    if (failure_swap) { /* hot swap: a new communicator under a new prefix with a fresh last rank */
        char p2[96];
        snprintf(p2, sizeof p2, "%s-epoch2", prefix);
        c = create_or_fail(p2, r, size, 10000);
        if (c != NULL) {
            float want = (float)(size * (size + 1) / 2);
            for (size_t i = 0; i < n; i++) b[i] = (float)(r + 1);
            s = comm_allreduce_sum(c, b, n, 10000);
            CHECK(s == COMM_OK && b[0] == want && b[n - 1] == want, "rank %d: allreduce after swap: %s %g", r,
                  comm_status_str(s), (double)b[0]);
            s = comm_barrier(c, 10000);
            CHECK(s == COMM_OK, "rank %d: barrier after swap: %s", r, comm_status_str(s));
            comm_destroy(c);
        }
    }
    free(b);
}

/* The replacement process: joins only the new epoch. */
static void rank_replacement(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    size_t n = failure_n;
    float want = (float)(size * (size + 1) / 2);
    float *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = (float)(r + 1);
    comm_status s = comm_allreduce_sum(c, b, n, 10000);
    CHECK(s == COMM_OK && b[0] == want && b[n - 1] == want, "replacement: allreduce: %s %g", comm_status_str(s),
          (double)b[0]);
    s = comm_barrier(c, 10000);
    CHECK(s == COMM_OK, "replacement: barrier: %s", comm_status_str(s));
    comm_destroy(c);
    free(b);
}

static void run_failure(int size, size_t n, int swap, const char *tag) {
    char prefix[64], p2[96];
    snprintf(prefix, sizeof prefix, "test-comm-%d-%s", (int)getpid(), tag);
    snprintf(p2, sizeof p2, "%s-epoch2", prefix);
    sh->kill_at = 0;
    failure_n = n;
    failure_swap = swap;
    pid_t pids[8];
    int v = size - 1;
    for (int r = 0; r < size; r++) pids[r] = spawn(rank_failure, r, prefix, size);
    /* the victim must die by SIGKILL */
    int st = 0;
    double deadline = now_s() + 15;
    pid_t got = 0;
    while (now_s() < deadline && (got = waitpid(pids[v], &st, WNOHANG)) == 0) sleep_ms(5);
    CHECK(got == pids[v] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "victim did not die by SIGKILL");
    if (got != pids[v]) {
        kill(pids[v], SIGKILL);
        waitpid(pids[v], NULL, 0);
    }
    if (swap) {
        pids[v] = spawn(rank_replacement, v, p2, size);
        wait_children(pids, size, 20, tag);
    } else {
        wait_children(pids, size - 1, 20, tag);
    }
    for (int r = 0; r < v; r++)
        printf("# %d ranks, %zu floats, survivor %d: %s %.0f ms after the peer's SIGKILL; comm_destroy %.1f ms\n",
               size, n, r, comm_status_str((comm_status)sh->detect_status[r]), sh->detect_ms[r], sh->destroy_ms[r]);
}

/* 3 ranks, rank 2 dies mid-allreduce of 4 MiB; then a new epoch with a fresh rank 2. */
static void test_peer_failure_and_swap(void) { run_failure(3, 1u << 20, 1, "fail3"); }

/* 4 ranks, rank 3 dies during a small allreduce: ranks 0 and 1 are blocked on live peers. */
static void test_peer_failure_cascade(void) { run_failure(4, 1024, 0, "fail4"); }

/* Timeout: rank 1 does not show up for the allreduce within rank 0's 500 ms. */
static void rank_timeout(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 10000);
    if (c == NULL) return;
    comm_status s = comm_barrier(c, 10000);
    CHECK(s == COMM_OK, "barrier: %s", comm_status_str(s));
    if (r == 1) {
        sleep_ms(1500);
        comm_destroy(c);
        return;
    }
    float b[256] = {0};
    double t0 = now_s();
    s = comm_allreduce_sum(c, b, 256, 500);
    double el = now_s() - t0;
    sh->timeout_status = (int)s;
    sh->timeout_elapsed_ms = el * 1e3;
    CHECK(s == COMM_ERR_TIMEOUT, "allreduce against a sleeping peer returned %s (%s)", comm_status_str(s),
          comm_last_error(c));
    CHECK(el > 0.4 && el < 3.0, "timeout after %.2f s, expected about 0.5 s", el);
    CHECK(comm_barrier(c, 5000) == COMM_ERR_TIMEOUT, "broken communicator did not repeat the timeout");
    comm_destroy(c);
}

static void test_timeout(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-timeout", (int)getpid());
    pid_t pids[2];
    for (int r = 0; r < 2; r++) pids[r] = spawn(rank_timeout, r, prefix, 2);
    wait_children(pids, 2, 15, "timeout");
    printf("# allreduce with timeout 500 ms against a sleeping peer: %s after %.0f ms\n",
           comm_status_str((comm_status)sh->timeout_status), sh->timeout_elapsed_ms);
}

static void rank_single(int r, const char *prefix, int size) {
    comm_t *c = create_or_fail(prefix, r, size, 2000);
    if (c == NULL) return;
    CHECK(comm_rank(c) == 0 && comm_size(c) == 1, "size-1 rank/size");
    float b[3] = {1.5f, -2.0f, 3.0f};
    CHECK(comm_allreduce_sum(c, b, 3, 1000) == COMM_OK && b[0] == 1.5f && b[1] == -2.0f && b[2] == 3.0f,
          "size-1 allreduce changed the data");
    float in[3] = {4, 5, 6}, out[3] = {0, 0, 0};
    CHECK(comm_allgather(c, in, out, 3, 1000) == COMM_OK && out[0] == 4 && out[2] == 6, "size-1 allgather");
    CHECK(comm_allgather(c, out, out, 3, 1000) == COMM_OK && out[1] == 5, "size-1 aliased allgather");
    char msg[6] = "hello";
    CHECK(comm_broadcast(c, msg, 6, 0, 1000) == COMM_OK && strcmp(msg, "hello") == 0, "size-1 broadcast");
    CHECK(comm_broadcast(c, msg, 6, 1, 1000) == COMM_ERR_INVALID, "size-1 broadcast from root 1 accepted");
    CHECK(comm_barrier(c, 1000) == COMM_OK, "size-1 barrier");
    comm_destroy(c);
}

static void test_size_one(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-single", (int)getpid());
    pid_t pid = spawn(rank_single, 0, prefix, 1);
    wait_children(&pid, 1, 10, "size 1");
}

/* 16 ranks: the rendezvous costs each rank a constant number of Redis round trips (publish,
 * fetch, and for every rank but the last one to arrive, one BLPOP per 20 ms of waiting),
 * never O(N) as Gloo's connectFullMesh (two per peer, plus polling); every pair connects
 * (a barrier, an allreduce and broadcasts from several roots use them all), and
 * comm_connections counts the full mesh: rank r dialed r peers and accepted size-1-r. */
#define MESH_RANKS 16
static void rank_mesh(int r, const char *prefix, int size) {
    double t0 = now_s();
    comm_t *c = create_or_fail(prefix, r, size, 20000);
    if (c == NULL) return;
    sh->mesh_create_ms[r] = (now_s() - t0) * 1e3;
    sh->mesh_rtt[r] = comm_store_round_trips(c);
    int dialed = -1, accepted = -1;
    comm_connections(c, &dialed, &accepted);
    CHECK(dialed == r && accepted == size - 1 - r, "rank %d: dialed %d, accepted %d (expected %d, %d)", r, dialed, accepted,
          r, size - 1 - r);
    comm_status s = comm_barrier(c, 20000);
    CHECK(s == COMM_OK, "rank %d: barrier: %s %s", r, comm_status_str(s), comm_last_error(c));
    float v[3] = {(float)r, 1.0f, (float)(r * r)};
    s = comm_allreduce_sum(c, v, 3, 20000);
    CHECK(s == COMM_OK && v[0] == (float)(size * (size - 1) / 2) && v[1] == (float)size,
          "rank %d: allreduce: %s, %g %g", r, comm_status_str(s), (double)v[0], (double)v[1]);
    for (int root = 0; root < size; root += 5) {
        int b = r == root ? 1000 + root : -1;
        s = comm_broadcast(c, &b, sizeof b, root, 20000);
        CHECK(s == COMM_OK && b == 1000 + root, "rank %d: broadcast from %d: %s, %d", r, root, comm_status_str(s), b);
    }
    comm_destroy(c);
}

static void test_rendezvous_16(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-mesh", (int)getpid());
    pid_t pids[MESH_RANKS];
    for (int r = 0; r < MESH_RANKS; r++) pids[r] = spawn(rank_mesh, r, prefix, MESH_RANKS);
    wait_children(pids, MESH_RANKS, 25, "16-rank rendezvous");
    unsigned long most = 0;
    double slowest = 0;
    for (int r = 0; r < MESH_RANKS; r++) {
        /* publish + fetch, and the waiting: at most one BLPOP per 20 ms of the whole create */
        unsigned long bound = 3 + (unsigned long)(sh->mesh_create_ms[r] / 20.0);
        CHECK(sh->mesh_rtt[r] >= 2 && sh->mesh_rtt[r] <= bound, "rank %d: %lu round trips in %.0f ms (at most %lu)", r,
              sh->mesh_rtt[r], sh->mesh_create_ms[r], bound);
        if (sh->mesh_rtt[r] > most) most = sh->mesh_rtt[r];
        if (sh->mesh_create_ms[r] > slowest) slowest = sh->mesh_create_ms[r];
    }
    printf("# 16 ranks: rendezvous in %.0f ms at most, %lu redis round trips at most per rank (Gloo's own: >= %d)\n",
           slowest, most, 2 * (MESH_RANKS - 1));
}

/* A rank waiting for peers that never come gives up when the abort key appears: at once when
 * its wake-up list is pushed too (what the coordinator does), else within Redis' timer
 * resolution (hz 10: 100 ms). */
#define ABORT_KEY_FMT "test-comm-%d-abort-key"
static int abort_push; /* the setter also pushes onto the waiter's wake-up list */
static void rank_abort_waiter(int r, const char *prefix, int size) {
    (void)r;
    char key[64], err[512];
    snprintf(key, sizeof key, ABORT_KEY_FMT, (int)getppid());
    comm_store_addr a = store;
    a.abort_key = key;
    comm_t *c = comm_create(&a, prefix, 0, size, BIND, 10000, err, sizeof err);
    double t = now_s();
    CHECK(c == NULL && strstr(err, "aborted") != NULL, "abort: %p, err '%s'", (void *)c, err);
    if (c) comm_destroy(c);
    sh->abort_ms = (t - sh->kill_at) * 1e3;
}

static void rank_abort_setter(int r, const char *prefix, int size) {
    (void)r;
    (void)prefix;
    (void)size;
    char key[64];
    snprintf(key, sizeof key, ABORT_KEY_FMT, (int)getppid());
    sleep_ms(300);
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    CHECK(rc != NULL && !rc->err, "setter: connect");
    if (rc == NULL || rc->err) return;
    redisReply *x = redisCommand(rc, "AUTH %s", REDIS_PW);
    if (x) freeReplyObject(x);
    sh->kill_at = now_s();
    x = redisCommand(rc, "SET %s 1", key);
    CHECK(x != NULL && x->type == REDIS_REPLY_STATUS, "setter: SET");
    if (x) freeReplyObject(x);
    if (abort_push) {
        char wake[128];
        comm_wake_key(prefix, 0, wake, sizeof wake);
        x = redisCommand(rc, "RPUSH %s %s", wake, COMM_WAKE_ABORT);
        CHECK(x != NULL && x->type == REDIS_REPLY_INTEGER, "setter: RPUSH");
        if (x) freeReplyObject(x);
    }
    redisFree(rc);
}

static void test_rendezvous_abort(void) {
    for (abort_push = 0; abort_push < 2; abort_push++) {
        char prefix[64], what[64];
        snprintf(prefix, sizeof prefix, "test-comm-%d-abort%d", (int)getpid(), abort_push);
        snprintf(what, sizeof what, "rendezvous abort%s", abort_push ? " with a wake-up" : "");
        /* the key of the first round must not abort the second before its time */
        struct timeval tv = {2, 0};
        redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
        if (rc && !rc->err) {
            redisReply *x = redisCommand(rc, "AUTH %s", REDIS_PW);
            if (x) freeReplyObject(x);
            x = redisCommand(rc, "DEL " ABORT_KEY_FMT, (int)getpid());
            if (x) freeReplyObject(x);
        }
        if (rc) redisFree(rc);
        sh->abort_ms = -1;
        pid_t pids[2] = {spawn(rank_abort_waiter, 0, prefix, 3), spawn(rank_abort_setter, 1, prefix, 3)};
        wait_children(pids, 2, 15, what);
        double bound = abort_push ? 100 : 500;
        CHECK(sh->abort_ms >= 0 && sh->abort_ms < bound, "%s: gave up %.0f ms after the abort key appeared (bound %.0f)",
              what, sh->abort_ms, bound);
        printf("# %s: gave up %.0f ms after the abort key appeared\n", what, sh->abort_ms);
    }
}

/* A collective in flight is aborted from outside: the coordinator's wake-up onto every rank's
 * list (what close_epoch pushes) fails it within milliseconds on every rank, although one
 * rank never enters it and the timeout is 10 s. Without it the ranks would wait that out. */
static void rank_in_flight(int r, const char *prefix, int size) {
    comm_store_addr a = store;
    char key[64], err[512];
    snprintf(key, sizeof key, "test-comm-%d-fence", (int)getppid());
    a.abort_key = key;
    comm_t *c = comm_create(&a, prefix, r, size, BIND, 10000, err, sizeof err);
    CHECK(c != NULL, "rank %d: comm_create: %s", r, err);
    if (!c) return;
    sh->abort_sockets[r] = comm_abort_sockets(c);
    CHECK(comm_barrier(c, 10000) == COMM_OK, "rank %d: barrier", r);
    if (r == size - 1) { /* never reaches the allreduce: the others would wait 10 s */
        sleep_ms(1500);
        comm_destroy(c);
        return;
    }
    float v[1024] = {0};
    comm_status s = comm_allreduce_sum(c, v, 1024, 10000);
    sh->left_ms[r] = (now_s() - sh->pushed_at) * 1e3;
    sh->left_status[r] = (int)s;
    comm_destroy(c);
}

static int pusher_delay_ms = 400;
static void pusher(int r, const char *prefix, int size) {
    (void)r;
    sleep_ms(pusher_delay_ms);
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    CHECK(rc != NULL && !rc->err, "pusher: connect");
    if (rc == NULL || rc->err) return;
    redisReply *x = redisCommand(rc, "AUTH %s", REDIS_PW);
    if (x) freeReplyObject(x);
    sh->pushed_at = now_s();
    for (int i = 0; i < size; i++) {
        char wake[128];
        comm_wake_key(prefix, i, wake, sizeof wake);
        redisAppendCommand(rc, "RPUSH %s %s", wake, COMM_WAKE_ABORT);
    }
    for (int i = 0; i < size; i++) {
        void *rep = NULL;
        CHECK(redisGetReply(rc, &rep) == REDIS_OK, "pusher: RPUSH");
        if (rep) freeReplyObject(rep);
    }
    redisFree(rc);
}

static void test_abort_in_flight(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-inflight", (int)getpid());
    memset(sh->left_ms, 0, sizeof sh->left_ms);
    pid_t pids[4];
    for (int r = 0; r < 3; r++) pids[r] = spawn(rank_in_flight, r, prefix, 3);
    pids[3] = spawn(pusher, 3, prefix, 3);
    wait_children(pids, 4, 20, "abort in flight");
    for (int r = 0; r < 2; r++) {
        CHECK(sh->left_status[r] == COMM_ERR_PEER && sh->left_ms[r] < 300,
              "rank %d left the allreduce %.0f ms after the wake-up with %s (expected a peer error within 300 ms)", r,
              sh->left_ms[r], comm_status_str((comm_status)sh->left_status[r]));
        printf("# rank %d: allreduce aborted %.0f ms after the wake-up (%s)\n", r, sh->left_ms[r],
               comm_status_str((comm_status)sh->left_status[r]));
    }
    for (int r = 0; r < 3; r++) CHECK(sh->abort_sockets[r] == 2, "rank %d holds %zu pair sockets, expected 2", r, sh->abort_sockets[r]);
}


/* Groups and point to point: four ranks build the epoch's communicator, then two groups of two
 * (0,1 and 2,3) and a chain of all four. Each pair sums within itself; along the chain every
 * rank first posts its sends to both neighbours, then receives (posting must not wait for the
 * receiver, or two stages sending to each other would deadlock); then the ranks but the last
 * wait for a message the last never sends, until a push onto the wake-up lists of the epoch's
 * communicator (the parent) aborts the groups too. */
static void rank_groups(int r, const char *prefix, int size) {
    comm_store_addr a = store;
    char key[64], err[512], gp[128];
    snprintf(key, sizeof key, "test-comm-%d-gfence", (int)getppid());
    a.abort_key = key;
    comm_t *world = comm_create(&a, prefix, r, size, BIND, 10000, err, sizeof err);
    CHECK(world != NULL, "rank %d: comm_create: %s", r, err);
    if (!world) return;
    snprintf(gp, sizeof gp, "%s/pair%d", prefix, r / 2);
    comm_t *pair = comm_create_group(world, &a, gp, r % 2, 2, BIND, 10000, err, sizeof err);
    snprintf(gp, sizeof gp, "%s/chain", prefix);
    comm_t *chain = comm_create_group(world, &a, gp, r, size, BIND, 10000, err, sizeof err);
    CHECK(pair && chain, "rank %d: comm_create_group: %s", r, err);
    if (!pair || !chain) return;
    float v[3] = {(float)r, 1.0f, 10.0f * r};
    CHECK(comm_allreduce_sum(pair, v, 3, 5000) == COMM_OK, "rank %d: pair allreduce", r);
    float base = (float)(r / 2 * 4 + 1); /* 0+1 or 2+3 */
    CHECK(v[0] == base && v[1] == 2.0f && v[2] == 10.0f * base, "rank %d: pair sum %g %g %g", r, v[0], v[1], v[2]);
    float up[256], down[256], got_up[256], got_down[256];
    for (int i = 0; i < 256; i++) up[i] = (float)(r * 1000 + i), down[i] = (float)(-r * 1000 - i);
    if (r + 1 < size) CHECK(comm_send(chain, up, sizeof up, r + 1, 7) == COMM_OK, "rank %d: send up", r);
    if (r > 0) CHECK(comm_send(chain, down, sizeof down, r - 1, 8) == COMM_OK, "rank %d: send down", r);
    if (r > 0) CHECK(comm_recv(chain, got_up, sizeof got_up, r - 1, 7, 5000) == COMM_OK, "rank %d: recv up", r);
    if (r + 1 < size) CHECK(comm_recv(chain, got_down, sizeof got_down, r + 1, 8, 5000) == COMM_OK, "rank %d: recv down", r);
    CHECK(comm_wait_sends(chain, 5000) == COMM_OK, "rank %d: wait sends", r);
    for (int i = 0; i < 256; i++) {
        if (r > 0 && got_up[i] != (float)((r - 1) * 1000 + i)) { CHECK(0, "rank %d: up[%d] = %g", r, i, got_up[i]); break; }
        if (r + 1 < size && got_down[i] != (float)(-(r + 1) * 1000 - i)) { CHECK(0, "rank %d: down[%d]", r, i); break; }
    }
    CHECK(comm_barrier(world, 5000) == COMM_OK, "rank %d: barrier", r);
    if (r == size - 1) sleep_ms(pusher_delay_ms + 1500); /* never sends: the others would wait 10 s */
    else {
        comm_status s = comm_recv(chain, got_up, sizeof got_up, r + 1, 9, 10000);
        sh->left_ms[r] = (now_s() - sh->pushed_at) * 1e3;
        sh->left_status[r] = (int)s;
    }
    comm_destroy(chain);
    comm_destroy(pair);
    comm_destroy(world);
}

static void test_groups_p2p(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-groups", (int)getpid());
    memset(sh->left_ms, 0, sizeof sh->left_ms);
    for (int r = 0; r < 4; r++) sh->left_status[r] = -1; /* not what test_abort_in_flight left */
    pid_t pids[5];
    pusher_delay_ms = 3000; /* after the groups are built and the chain has exchanged */
    for (int r = 0; r < 4; r++) pids[r] = spawn(rank_groups, r, prefix, 4);
    pids[4] = spawn(pusher, 4, prefix, 4);
    wait_children(pids, 5, 30, "groups");
    pusher_delay_ms = 400;
    for (int r = 0; r < 3; r++) {
        CHECK(sh->left_status[r] == COMM_ERR_PEER && sh->left_ms[r] < 500,
              "rank %d left the group's receive %.0f ms after the wake-up with %s (expected a peer error within 500 ms)",
              r, sh->left_ms[r], comm_status_str((comm_status)sh->left_status[r]));
        printf("# rank %d: a group's receive aborted %.0f ms after the wake-up of the parent\n", r, sh->left_ms[r]);
    }
}

/* Store problems and a rendezvous nobody else joins. */
static void rank_store_errors(int r, const char *prefix, int size) {
    (void)r;
    (void)size;
    char err[512];
    comm_store_addr bad = store;
    bad.password = "wrong-password";
    comm_t *c = comm_create(&bad, prefix, 0, 2, BIND, 2000, err, sizeof err);
    CHECK(c == NULL && strstr(err, "store") != NULL, "wrong password: %p, err '%s'", (void *)c, err);
    if (c) comm_destroy(c);

    bad = store;
    bad.password = NULL;
    c = comm_create(&bad, prefix, 0, 2, BIND, 2000, err, sizeof err);
    CHECK(c == NULL && strlen(err) > 0, "no password accepted by a protected redis: err '%s'", err);
    if (c) comm_destroy(c);

    bad = store;
    bad.port = free_port();
    double t0 = now_s();
    c = comm_create(&bad, prefix, 0, 2, BIND, 2000, err, sizeof err);
    CHECK(c == NULL && strstr(err, "store") != NULL, "unreachable redis: err '%s'", err);
    CHECK(now_s() - t0 < 3.0, "unreachable redis took %.2f s", now_s() - t0);
    if (c) comm_destroy(c);

    t0 = now_s();
    c = comm_create(&store, prefix, 0, 2, BIND, 500, err, sizeof err);
    double el = now_s() - t0;
    CHECK(c == NULL && strstr(err, "timeout") != NULL, "lonely rendezvous: err '%s'", err);
    CHECK(el > 0.4 && el < 3.0, "lonely rendezvous gave up after %.2f s, timeout 0.5 s", el);
    if (c) comm_destroy(c);

    c = comm_create(&store, prefix, 2, 2, BIND, 500, err, sizeof err);
    CHECK(c == NULL && strlen(err) > 0, "rank == size accepted");
    if (c) comm_destroy(c);
}

/* ---------------- the data plane's wire format (comm_auth.h) ---------------- */

static const unsigned char *other_key(void) {
    static unsigned char k[COMM_KEY_BYTES];
    comm_key_derive("ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100", k);
    return k;
}

/* Runs a handshake between dialer d and acceptor a of (prefix, size): the dialer's key kd, the
 * acceptor's ka. Returns the acceptor's verdict on the proof; on success also the dialer's on
 * the confirmation (*confirm) and both sessions. */
static int handshake(const char *prefix, uint32_t size, uint32_t d, uint32_t a, const unsigned char *kd,
                     const unsigned char *ka, int *confirm, comm_session *sd, comm_session *sa,
                     unsigned char proof_out[COMM_HS_PROOF_BYTES]) {
    comm_hs acc = {0}, dia = {0};
    acc.size = dia.size = size;
    acc.acceptor = a;
    dia.acceptor = a;
    dia.dialer = d;
    snprintf(acc.prefix, sizeof acc.prefix, "%s", prefix);
    snprintf(dia.prefix, sizeof dia.prefix, "%s", prefix);
    unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES], conf[COMM_HS_CONFIRM_BYTES];
    comm_hs_hello(&acc, hello);
    if (comm_hs_parse_hello(&dia, hello, sizeof hello) != COMM_HS_OK) return 99;
    comm_hs_proof(&dia, kd, proof);
    if (proof_out) memcpy(proof_out, proof, sizeof proof);
    int r = comm_hs_check_proof(&acc, ka, proof, sizeof proof);
    *confirm = 99;
    if (r != COMM_HS_OK) return r;
    comm_hs_confirm(&acc, ka, conf);
    *confirm = comm_hs_check_confirm(&dia, kd, conf, sizeof conf);
    comm_hs_session(&dia, kd, 1, sd);
    comm_hs_session(&acc, ka, 0, sa);
    return r;
}

static void test_auth_handshake(void) {
    int confirm;
    comm_session sd, sa;
    /* the right key: both sides agree, and their direction keys pair up */
    CHECK(handshake("job/e/1", 4, 3, 1, test_key, test_key, &confirm, &sd, &sa, NULL) == COMM_HS_OK && confirm == COMM_HS_OK,
          "handshake with the job's key refused");
    CHECK(memcmp(sd.tx, sa.rx, 32) == 0 && memcmp(sd.rx, sa.tx, 32) == 0 && memcmp(sd.tx, sd.rx, 32) != 0,
          "the two ends' session keys do not pair up");
    /* a wrong key: the acceptor refuses the proof, before anything else */
    CHECK(handshake("job/e/1", 4, 3, 1, other_key(), test_key, &confirm, &sd, &sa, NULL) == COMM_HS_BAD_MAC,
          "proof made with another key accepted");
    /* a dialer reached by an acceptor without the key refuses its confirmation */
    {
        comm_hs dia = {0}, acc = {0};
        dia.size = acc.size = 2;
        dia.dialer = 1;
        dia.acceptor = acc.acceptor = 0;
        snprintf(dia.prefix, sizeof dia.prefix, "p");
        snprintf(acc.prefix, sizeof acc.prefix, "p");
        unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES], conf[COMM_HS_CONFIRM_BYTES];
        comm_hs_hello(&acc, hello);
        comm_hs_parse_hello(&dia, hello, sizeof hello);
        comm_hs_proof(&dia, test_key, proof);
        /* a squatter without the key cannot check the proof; it makes up a confirmation */
        acc.dialer = 1;
        memcpy(acc.nd, proof + 8, COMM_NONCE_BYTES);
        comm_hs_confirm(&acc, other_key(), conf);
        CHECK(comm_hs_check_confirm(&dia, test_key, conf, sizeof conf) == COMM_HS_BAD_MAC,
              "confirmation made with another key accepted");
        comm_hs_confirm(&acc, test_key, conf);
        CHECK(comm_hs_check_confirm(&dia, test_key, conf, sizeof conf) == COMM_HS_OK, "the right confirmation refused");
        conf[5] ^= 1;
        CHECK(comm_hs_check_confirm(&dia, test_key, conf, sizeof conf) == COMM_HS_BAD_MAC, "changed confirmation accepted");
        CHECK(comm_hs_check_confirm(&dia, test_key, conf, sizeof conf - 1) == COMM_HS_MALFORMED, "short confirmation accepted");
        hello[0] = 'X';
        CHECK(comm_hs_parse_hello(&dia, hello, sizeof hello) == COMM_HS_MALFORMED, "hello without the magic accepted");
        CHECK(comm_hs_parse_hello(&dia, hello, 3) == COMM_HS_MALFORMED, "short hello accepted");
    }
    /* wrong ranks: a proof naming another acceptor, the acceptor itself, or no rank of the
     * communicator, is refused for its ranks; a proof that lies about the dialer fails its MAC */
    CHECK(handshake("job/e/1", 4, 3, 1, test_key, test_key, &confirm, &sd, &sa, NULL) == COMM_HS_OK, "baseline");
    {
        comm_hs acc = {0}, dia = {0};
        acc.size = dia.size = 4;
        acc.acceptor = 1;
        dia.acceptor = 2; /* meant for rank 2 */
        dia.dialer = 3;
        snprintf(acc.prefix, sizeof acc.prefix, "job/e/1");
        snprintf(dia.prefix, sizeof dia.prefix, "job/e/1");
        unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES];
        comm_hs_hello(&acc, hello);
        comm_hs_parse_hello(&dia, hello, sizeof hello);
        comm_hs_proof(&dia, test_key, proof);
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_RANK, "proof for another acceptor accepted");
        dia.acceptor = 1;
        dia.dialer = 1; /* itself */
        comm_hs_proof(&dia, test_key, proof);
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_RANK, "proof from the acceptor's own rank accepted");
        dia.dialer = 4; /* no such rank */
        comm_hs_proof(&dia, test_key, proof);
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_RANK, "proof from rank 4 of 4 accepted");
        dia.dialer = 3;
        comm_hs_proof(&dia, test_key, proof);
        proof[0] = 2; /* claims rank 2, MAC'd as rank 3 */
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_MAC, "proof with a changed rank accepted");
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof - 1) == COMM_HS_MALFORMED, "short proof accepted");
    }
    /* another communicator (an old epoch's prefix) or another size: refused */
    {
        comm_hs acc = {0}, dia = {0};
        acc.size = dia.size = 4;
        acc.acceptor = dia.acceptor = 1;
        dia.dialer = 3;
        snprintf(acc.prefix, sizeof acc.prefix, "job/e/2");
        snprintf(dia.prefix, sizeof dia.prefix, "job/e/1");
        unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES];
        comm_hs_hello(&acc, hello);
        comm_hs_parse_hello(&dia, hello, sizeof hello);
        comm_hs_proof(&dia, test_key, proof);
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_MAC, "proof for another prefix accepted");
        snprintf(acc.prefix, sizeof acc.prefix, "job/e/1");
        acc.size = 5;
        CHECK(comm_hs_check_proof(&acc, test_key, proof, sizeof proof) == COMM_HS_BAD_MAC, "proof for another size accepted");
    }
    /* a replayed proof: recorded from one connection, refused on the next (a fresh Na) */
    {
        unsigned char recorded[COMM_HS_PROOF_BYTES];
        CHECK(handshake("job/e/1", 4, 3, 1, test_key, test_key, &confirm, &sd, &sa, recorded) == COMM_HS_OK, "recorded run");
        comm_hs acc = {0};
        acc.size = 4;
        acc.acceptor = 1;
        snprintf(acc.prefix, sizeof acc.prefix, "job/e/1");
        unsigned char hello[COMM_HS_HELLO_BYTES];
        comm_hs_hello(&acc, hello);
        CHECK(comm_hs_check_proof(&acc, test_key, recorded, sizeof recorded) == COMM_HS_BAD_MAC, "replayed proof accepted");
    }
    /* two runs with the same parties never share session keys */
    comm_session sd2, sa2;
    handshake("job/e/1", 4, 3, 1, test_key, test_key, &confirm, &sd2, &sa2, NULL);
    CHECK(memcmp(sd.tx, sd2.tx, 32) != 0, "two handshakes gave the same session key");
    /* the key of a job: 64 hex digits, nothing else */
    unsigned char k[COMM_KEY_BYTES];
    CHECK(comm_key_derive("00112233", k) != 0, "short secret accepted");
    CHECK(comm_key_derive("zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", k) != 0, "non-hex secret accepted");
    CHECK(comm_key_derive("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", k) == 0 &&
              memcmp(k, test_key, sizeof k) == 0, "the key is not a function of the secret");
}

static void test_auth_frames(void) {
    int confirm;
    comm_session sd, sa;
    handshake("job/e/7", 2, 1, 0, test_key, test_key, &confirm, &sd, &sa, NULL);
    unsigned char head[COMM_FRAME_HEAD_BYTES], tag[COMM_FRAME_TAG_BYTES];
    crypto_onetimeauth_state ps, pr;
    comm_frame f = {COMM_FRAME_DATA, 0x1234567890ull, 1000}, g;
    unsigned char payload[1000];
    for (int i = 0; i < 1000; i++) payload[i] = (unsigned char)(i * 7);
    /* a good frame opens, its payload checks out */
    comm_frame_seal(&sd, &f, head, &ps);
    crypto_onetimeauth_update(&ps, payload, 600);
    crypto_onetimeauth_update(&ps, payload + 600, 400);
    comm_frame_payload_tag(&ps, tag);
    comm_session rx0 = sa;
    CHECK(comm_frame_open(&sa, head, 1u << 20, &g, &pr) == COMM_FRAME_OK && g.type == f.type && g.slot == f.slot &&
              g.nbytes == f.nbytes && sa.rx_seq == 1, "a good frame did not open");
    crypto_onetimeauth_update(&pr, payload, 1000);
    CHECK(comm_frame_payload_check(&pr, tag) == 0, "a good payload refused");
    /* a changed payload byte, a changed tag */
    comm_session s1 = rx0;
    comm_frame_open(&s1, head, 1u << 20, &g, &pr);
    payload[500] ^= 0x40;
    crypto_onetimeauth_update(&pr, payload, 1000);
    CHECK(comm_frame_payload_check(&pr, tag) != 0, "changed payload accepted");
    payload[500] ^= 0x40;
    s1 = rx0;
    comm_frame_open(&s1, head, 1u << 20, &g, &pr);
    crypto_onetimeauth_update(&pr, payload, 1000);
    tag[3] ^= 1;
    CHECK(comm_frame_payload_check(&pr, tag) != 0, "changed payload tag accepted");
    tag[3] ^= 1;
    /* every bit of the header and its tag matters */
    int opened = 0;
    for (int bit = 0; bit < COMM_FRAME_HEAD_BYTES * 8; bit++) {
        s1 = rx0;
        head[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        if (comm_frame_open(&s1, head, 1u << 20, &g, &pr) != COMM_FRAME_BAD_TAG || s1.rx_seq != 0) opened++;
        head[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    CHECK(opened == 0, "%d one-bit changes of a frame header opened", opened);
    /* a replay: the same frame again is the next sequence number's, and refused */
    CHECK(comm_frame_open(&sa, head, 1u << 20, &g, &pr) == COMM_FRAME_BAD_TAG, "replayed frame accepted");
    /* out of order: frame 2 before frame 1 */
    unsigned char h1[COMM_FRAME_HEAD_BYTES], h2[COMM_FRAME_HEAD_BYTES];
    comm_frame r = {COMM_FRAME_RECV_READY, 9, 64};
    comm_frame_seal(&sd, &r, h1, NULL);
    comm_frame_seal(&sd, &r, h2, NULL);
    CHECK(comm_frame_open(&sa, h2, 1u << 20, &g, NULL) == COMM_FRAME_BAD_TAG, "reordered frame accepted");
    CHECK(comm_frame_open(&sa, h1, 1u << 20, &g, NULL) == COMM_FRAME_OK && g.type == COMM_FRAME_RECV_READY && g.slot == 9 &&
              g.nbytes == 64, "in-order frame refused");
    CHECK(comm_frame_open(&sa, h2, 1u << 20, &g, NULL) == COMM_FRAME_OK, "in-order frame refused");
    /* reflected: a frame the acceptor sent, fed back to it */
    unsigned char back[COMM_FRAME_HEAD_BYTES];
    comm_session sa_tx = sa;
    comm_frame_seal(&sa_tx, &r, back, NULL);
    comm_session sa_rx = sa;
    CHECK(comm_frame_open(&sa_rx, back, 1u << 20, &g, NULL) == COMM_FRAME_BAD_TAG, "reflected frame accepted");
    /* another connection's frame (same parties, another handshake) */
    comm_session od, oa;
    handshake("job/e/7", 2, 1, 0, test_key, test_key, &confirm, &od, &oa, NULL);
    comm_frame_seal(&od, &r, h1, NULL);
    comm_session sa3 = sa;
    CHECK(comm_frame_open(&sa3, h1, 1u << 20, &g, NULL) == COMM_FRAME_BAD_TAG, "another connection's frame accepted");
    /* well tagged, but no frame of this protocol: an unknown type, a DATA frame over the bound */
    comm_frame bad = {'X', 1, 1};
    comm_frame_seal(&sd, &bad, h1, NULL);
    comm_session sa4 = sa;
    CHECK(comm_frame_open(&sa4, h1, 1u << 20, &g, NULL) == COMM_FRAME_MALFORMED, "unknown frame type accepted");
    comm_frame big = {COMM_FRAME_DATA, 1, 1u << 21};
    comm_session sd5 = sd, sa5 = sa;
    sd5.tx_seq = sa5.rx_seq;
    comm_frame_seal(&sd5, &big, h1, &ps);
    CHECK(comm_frame_open(&sa5, h1, 1u << 20, &g, &pr) == COMM_FRAME_MALFORMED, "DATA frame over the bound accepted");
}

/* A stranger (no key) knocks on rank 0's listener as soon as the rendezvous names it, before
 * the real peers dial: silent connections (more than the listener lets handshake at once),
 * junk, a proof made with another key. The communicator still forms, its allreduce is right,
 * and no stranger's connection receives anything but the 36-byte HELLO before it is closed. */
#define STRANGER_SILENT 80
#define STRANGER_JUNK 10
static void stranger(int r, const char *prefix, int size) {
    (void)r;
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    CHECK(rc != NULL && !rc->err, "stranger: redis connect");
    if (rc == NULL || rc->err) return;
    redisReply *x = redisCommand(rc, "AUTH %s", REDIS_PW);
    if (x) freeReplyObject(x);
    /* the address rank 0 published for rank 1: a sockaddr first */
    struct sockaddr_storage ss;
    int found = 0;
    for (int i = 0; i < 1000 && !found; i++) {
        x = redisCommand(rc, "HGET %s/m/0 1", prefix);
        if (x && x->type == REDIS_REPLY_STRING && x->len >= (long)sizeof ss) {
            memcpy(&ss, x->str, sizeof ss);
            found = 1;
        }
        if (x) freeReplyObject(x);
        if (!found) sleep_ms(5);
    }
    redisFree(rc);
    CHECK(found, "stranger: rank 0 published no address");
    if (!found) return;
    int n = STRANGER_SILENT + STRANGER_JUNK + 1, fds[STRANGER_SILENT + STRANGER_JUNK + 1];
    long got[STRANGER_SILENT + STRANGER_JUNK + 1] = {0};
    int closed[STRANGER_SILENT + STRANGER_JUNK + 1] = {0}, hello_only = 1;
    unsigned char first[STRANGER_SILENT + STRANGER_JUNK + 1][4];
    for (int i = 0; i < n; i++) {
        fds[i] = socket(ss.ss_family, SOCK_STREAM, 0);
        if (connect(fds[i], (struct sockaddr *)&ss, ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) != 0) {
            close(fds[i]);
            fds[i] = -1;
            continue;
        }
        sh->stranger_conns++;
        if (i >= STRANGER_SILENT && i < STRANGER_SILENT + STRANGER_JUNK) {
            unsigned char junk[COMM_HS_PROOF_BYTES];
            randombytes_buf(junk, sizeof junk);
            junk[0] = 1, junk[1] = junk[2] = junk[3] = 0, junk[4] = junk[5] = junk[6] = junk[7] = 0; /* "rank 1 to rank 0" */
            if (write(fds[i], junk, sizeof junk) < 0) {
            }
        } else if (i == n - 1) {
            /* a proof with another key, made on the HELLO it got */
            unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES];
            comm_hs hs = {0};
            hs.size = (uint32_t)size;
            hs.dialer = 1;
            hs.acceptor = 0;
            snprintf(hs.prefix, sizeof hs.prefix, "%s", prefix);
            if (read(fds[i], hello, sizeof hello) == (ssize_t)sizeof hello && comm_hs_parse_hello(&hs, hello, sizeof hello) == 0) {
                got[i] = sizeof hello;
                memcpy(first[i], hello, 4);
                comm_hs_proof(&hs, other_key(), proof);
                if (write(fds[i], proof, sizeof proof) < 0) {
                }
            }
        }
    }
    /* read everything each connection gets until the job closes it (or 6 s) */
    double deadline = now_s() + 6.0;
    int open_left = 1;
    while (open_left && now_s() < deadline) {
        open_left = 0;
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || closed[i]) continue;
            unsigned char buf[256];
            ssize_t rv = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
            if (rv > 0) {
                if (got[i] < 4) memcpy(first[i] + got[i], buf, (size_t)(rv < 4 - got[i] ? rv : 4 - got[i]));
                got[i] += rv;
            } else if (rv == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                closed[i] = 1;
                sh->stranger_closed++;
                continue;
            }
            open_left = 1;
        }
        sleep_ms(10);
    }
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        if (got[i] > sh->stranger_max_bytes) sh->stranger_max_bytes = got[i];
        if (got[i] != 0 && (got[i] != COMM_HS_HELLO_BYTES || memcmp(first[i], "DPC1", 4) != 0)) hello_only = 0;
        close(fds[i]);
    }
    sh->stranger_hello_only = hello_only;
}

static void rank_knocked(int r, const char *prefix, int size) {
    if (r > 0) sleep_ms(800); /* the stranger is first */
    double t0 = now_s();
    comm_t *c = create_or_fail(prefix, r, size, 15000);
    sh->stranger_create_ms[r] = (now_s() - t0) * 1e3;
    if (c == NULL) return;
    float b[1000];
    for (int i = 0; i < 1000; i++) b[i] = (float)(r + i);
    comm_status s = comm_allreduce_sum(c, b, 1000, 10000);
    CHECK(s == COMM_OK && b[0] == 3.0f && b[999] == 3.0f * 999.0f + 3.0f, "allreduce among knocked ranks: %s (%s) b[0]=%g",
          comm_status_str(s), comm_last_error(c), (double)b[0]);
    comm_destroy(c);
}

static void test_strangers_knock(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-knock", (int)getpid());
    pid_t pids[4];
    for (int r = 0; r < 3; r++) pids[r] = spawn(rank_knocked, r, prefix, 3);
    pids[3] = spawn(stranger, 3, prefix, 3);
    wait_children(pids, 4, 25, "strangers knock");
    CHECK(sh->stranger_conns == STRANGER_SILENT + STRANGER_JUNK + 1, "the stranger opened %d connections", sh->stranger_conns);
    CHECK(sh->stranger_closed == sh->stranger_conns, "the job closed %d of the stranger's %d connections", sh->stranger_closed,
          sh->stranger_conns);
    CHECK(sh->stranger_hello_only && sh->stranger_max_bytes <= COMM_HS_HELLO_BYTES,
          "a stranger's connection received %ld bytes (more than the HELLO)", sh->stranger_max_bytes);
    printf("# %d stranger connections (%d silent, %d junk, 1 proof with another key): all closed, at most %ld bytes "
           "received (the HELLO); comm_create %.0f / %.0f / %.0f ms\n",
           sh->stranger_conns, STRANGER_SILENT, STRANGER_JUNK, sh->stranger_max_bytes, sh->stranger_create_ms[0],
           sh->stranger_create_ms[1], sh->stranger_create_ms[2]);
}

/* A rank with another key (another job's) never joins: both ends give up at the timeout. */
static void rank_wrong_key(int r, const char *prefix, int size) {
    comm_store_addr a = store;
    if (r == 1) a.key = other_key();
    char err[512];
    double t0 = now_s();
    comm_t *c = comm_create(&a, prefix, r, size, BIND, 2000, err, sizeof err);
    double el = now_s() - t0;
    CHECK(c == NULL, "rank %d: a communicator formed with a rank of another key", r);
    /* rank 0 waited for a dialer with the key; rank 1 kept retrying until rank 0 gave up */
    CHECK(c != NULL || r == 1 || strstr(err, "did not connect (with the job's key)") != NULL, "rank %d: %s", r, err);
    CHECK(el < 6.0, "rank %d gave up after %.1f s", r, el);
    if (c) comm_destroy(c);
    printf("# rank %d (%s key): %s\n", r, r == 1 ? "another" : "the job's", err);
}

static void test_wrong_key_refused(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-wrongkey", (int)getpid());
    pid_t pids[2];
    for (int r = 0; r < 2; r++) pids[r] = spawn(rank_wrong_key, r, prefix, 2);
    wait_children(pids, 2, 15, "wrong key");
    comm_store_addr a = store;
    a.key = NULL;
    char err[256];
    comm_t *c = comm_create(&a, prefix, 0, 2, BIND, 1000, err, sizeof err);
    CHECK(c == NULL && strstr(err, "no data-plane key") != NULL, "comm_create without a key: %s", c ? "accepted" : err);
}

/* An on-path attacker between rank 1 and rank 0: it rewrites rank 0's published address (as if
 * it had the store; it has no key) so that rank 1 dials a relay, which passes the handshake on
 * untouched and then flips one bit of rank 1's stream. Without the flip the relayed pair works
 * (a relay learns nothing it can use); with it the frame is refused and the allreduce fails on
 * both ranks: never a success with changed data. */
static int mitm_flip; /* set by the parent before spawning */
static void mitm_relay(int r, const char *prefix, int size) {
    (void)r;
    (void)size;
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (rc == NULL || rc->err) return;
    redisReply *x = redisCommand(rc, "AUTH %s", REDIS_PW);
    if (x) freeReplyObject(x);
    unsigned char addr[256];
    size_t alen = 0;
    for (int i = 0; i < 1000 && alen == 0; i++) {
        x = redisCommand(rc, "HGET %s/m/0 1", prefix);
        if (x && x->type == REDIS_REPLY_STRING && x->len >= (long)sizeof(struct sockaddr_storage) && x->len <= 256) {
            alen = (size_t)x->len;
            memcpy(addr, x->str, alen);
        }
        if (x) freeReplyObject(x);
        if (alen == 0) sleep_ms(2);
    }
    CHECK(alen > 0, "relay: rank 0 published no address");
    if (alen == 0) return;
    struct sockaddr_in real, mine;
    memcpy(&real, addr, sizeof real);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&mine, 0, sizeof mine);
    mine.sin_family = AF_INET;
    mine.sin_addr.s_addr = htonl(0x7f000001);
    socklen_t ml = sizeof mine;
    CHECK(bind(lfd, (struct sockaddr *)&mine, sizeof mine) == 0 && listen(lfd, 4) == 0 &&
              getsockname(lfd, (struct sockaddr *)&mine, &ml) == 0, "relay: listen");
    memcpy(addr, &mine, sizeof mine); /* same record, the relay's address */
    x = redisCommand(rc, "HSET %s/m/0 1 %b", prefix, addr, alen);
    if (x) freeReplyObject(x);
    redisFree(rc);
    struct pollfd pl = {lfd, POLLIN, 0};
    if (poll(&pl, 1, 8000) != 1) return;
    int a = accept(lfd, NULL, NULL), b = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(a >= 0 && connect(b, (struct sockaddr *)&real, sizeof real) == 0, "relay: connect to rank 0");
    sh->mitm_relayed = 1;
    sh->mitm_flipped_at = -1;
    long from_dialer = 0;
    const long flip_at = COMM_HS_PROOF_BYTES + 300; /* past the handshake, inside the frames */
    double deadline = now_s() + 10.0;
    while (now_s() < deadline) {
        struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        if (poll(p, 2, 100) <= 0) continue;
        unsigned char buf[65536];
        if (p[0].revents) {
            ssize_t n = recv(a, buf, sizeof buf, 0);
            if (n <= 0) break;
            if (mitm_flip && from_dialer <= flip_at && from_dialer + n > flip_at) {
                buf[flip_at - from_dialer] ^= 0x10;
                sh->mitm_flipped_at = flip_at;
            }
            from_dialer += n;
            if (send(b, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
        }
        if (p[1].revents) {
            ssize_t n = recv(b, buf, sizeof buf, 0);
            if (n <= 0) break;
            if (send(a, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
        }
    }
    close(a);
    close(b);
    close(lfd);
}

static void rank_mitm(int r, const char *prefix, int size) {
    if (r == 1) sleep_ms(500); /* the relay rewrites rank 0's record first */
    comm_t *c = create_or_fail(prefix, r, size, 8000);
    if (c == NULL) return;
    float b[4096];
    for (int i = 0; i < 4096; i++) b[i] = (float)(r + 1);
    comm_status s = comm_allreduce_sum(c, b, 4096, 5000);
    if (s == COMM_OK) s = comm_allreduce_sum(c, b, 4096, 5000); /* more frames past the flip */
    sh->mitm_status[r] = (int)s;
    snprintf(sh->mitm_error[r], sizeof sh->mitm_error[r], "%s", comm_last_error(c));
    if (s == COMM_OK) {
        int bad = 0;
        for (int i = 0; i < 4096; i++) bad += b[i] != 6.0f;
        CHECK(bad == 0, "rank %d: the relayed allreduce returned ok with %d wrong sums", r, bad);
    }
    comm_destroy(c);
}

static void test_tampered_frame_refused(void) {
    for (mitm_flip = 0; mitm_flip < 2; mitm_flip++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "test-comm-%d-mitm%d", (int)getpid(), mitm_flip);
        memset(sh->mitm_status, 0xff, sizeof sh->mitm_status);
        sh->mitm_relayed = 0;
        pid_t pids[3];
        pids[2] = spawn(mitm_relay, 2, prefix, 2);
        for (int r = 0; r < 2; r++) pids[r] = spawn(rank_mitm, r, prefix, 2);
        wait_children(pids, 3, 20, mitm_flip ? "tampering relay" : "plain relay");
        CHECK(sh->mitm_relayed, "the relay never carried rank 1's connection");
        if (!mitm_flip) {
            CHECK(sh->mitm_status[0] == COMM_OK && sh->mitm_status[1] == COMM_OK, "a plain relay broke the pair: %s / %s",
                  sh->mitm_error[0], sh->mitm_error[1]);
            continue;
        }
        CHECK(sh->mitm_flipped_at > 0, "the relay flipped nothing");
        CHECK(sh->mitm_status[0] == COMM_ERR_PEER && strstr(sh->mitm_error[0], "does not check out") != NULL,
              "rank 0 after a flipped bit: %s (%s)", comm_status_str((comm_status)sh->mitm_status[0]), sh->mitm_error[0]);
        CHECK(sh->mitm_status[1] != COMM_OK, "rank 1 finished the allreduce over a tampered connection");
        printf("# a bit flipped at byte %ld of rank 1's stream: rank 0 %s (%s); rank 1 %s\n", sh->mitm_flipped_at,
               comm_status_str((comm_status)sh->mitm_status[0]), sh->mitm_error[0],
               comm_status_str((comm_status)sh->mitm_status[1]));
    }
}

static void test_store_errors(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test-comm-%d-store", (int)getpid());
    pid_t pid = spawn(rank_store_errors, 0, prefix, 2);
    wait_children(&pid, 1, 15, "store errors");
}

int main(void) {
    parent_pid = getpid();
    signal(SIGPIPE, SIG_IGN); /* writing the redis config; children restore the default */
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    atexit(stop_redis);
    signal(SIGTERM, on_fatal_signal);
    signal(SIGINT, on_fatal_signal);
    if (start_redis() != 0) {
        printf("not ok - start_redis (see stderr)\n");
        return 1;
    }
    store.host = "127.0.0.1";
    store.port = redis_port;
    store.password = REDIS_PW;
    store.key = test_key;
    if (comm_key_derive("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", test_key) != 0) {
        printf("not ok - comm_key_derive\n");
        return 1;
    }

    double t0 = now_s();
    RUN_TEST(test_size_one);
    RUN_TEST(test_collectives_4ranks);
    RUN_TEST(test_allreduce_mean_3ranks);
    RUN_TEST(test_allreduce_typed_3ranks);
    RUN_TEST(test_peer_failure_and_swap);
    RUN_TEST(test_peer_failure_cascade);
    RUN_TEST(test_timeout);
    RUN_TEST(test_store_errors);
    RUN_TEST(test_rendezvous_16);
    RUN_TEST(test_rendezvous_abort);
    RUN_TEST(test_abort_in_flight);
    RUN_TEST(test_groups_p2p);
    RUN_TEST(test_auth_handshake);
    RUN_TEST(test_auth_frames);
    RUN_TEST(test_strangers_knock);
    RUN_TEST(test_wrong_key_refused);
    RUN_TEST(test_tampered_frame_refused);
    printf("# test_comm total %.1f s\n", now_s() - t0);
    stop_redis();
    TEST_MAIN_END();
}
