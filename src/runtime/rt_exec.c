/* rt_exec.c — starting a job's process: the environment a launcher hands it (written by
 * worker_env_set, read back at dp_init by rt_options_from_env), its program's command line
 * (the built-in GPT-2 trainer, DP_BUILTIN_PROGRAM, runs as `deadpool train`), and `deadpool
 * worker`, which reads the program from the job's Redis and becomes it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime_internal.h"

#include "runtime.h"
#include "secret.h"
#include "util.h"

void rt_options_from_env(dp_options *o) {
    const char *rank = getenv(DP_ENV_RANK), *spare = getenv(DP_ENV_SPARE);
    if (!o->redis_url) o->redis_url = getenv(DP_ENV_REDIS);
    if (!o->job) o->job = getenv(DP_ENV_JOB);
    if (!o->bind_host) o->bind_host = getenv(DP_ENV_BIND);
    if (!o->spare && spare && !strcmp(spare, "1")) o->spare = 1;
    if (o->rank < 0 && rank && *rank) o->rank = atoi(rank);
}

void worker_env_set(const WorkerArgs *a) {
    char rank[32];
    setenv(DP_ENV_REDIS, a->redis_url, 1);
    setenv(DP_ENV_JOB, a->job, 1);
    if (a->bind_host) setenv(DP_ENV_BIND, a->bind_host, 1);
    else unsetenv(DP_ENV_BIND);
    if (a->spare) setenv(DP_ENV_SPARE, "1", 1);
    else unsetenv(DP_ENV_SPARE);
    snprintf(rank, sizeof rank, "%d", a->rank);
    if (a->rank >= 0) setenv(DP_ENV_RANK, rank, 1);
    else unsetenv(DP_ENV_RANK);
    if (a->node) setenv(DP_ENV_NODE, a->node, 1);
    if (a->out) setenv(DP_ENV_OUT, a->out, 1);
    if (a->resume) setenv(DP_ENV_RESUME, a->resume, 1);
    snprintf(rank, sizeof rank, "%ld", a->proc);
    if (a->proc > 0) setenv(DP_ENV_PROC, rank, 1);
    else unsetenv(DP_ENV_PROC);
}

int program_argv(const JobConfig *c, const char *self_exe, char *buf, size_t len, char **argv, int max) {
    char *parts[1024];
    int n = job_config_program_argv(c, buf, len, parts, 1024), k = 0;
    for (int i = 0; i < n && k < max - 2; i++) {
        if (i == 0 && !strcmp(parts[0], DP_BUILTIN_PROGRAM)) {
            argv[k++] = (char *)self_exe;
            argv[k++] = "train";
        } else {
            argv[k++] = parts[i];
        }
    }
    argv[k] = NULL;
    return k;
}

/* The job key of a process started by hand: from --secret-file (the secret its machines
 * share), or DEADPOOL_JOB_KEY as a launcher sets it. Into the environment the program gets. */
static int worker_job_key(const WorkerArgs *a, char key[JOB_KEY_HEX_LEN + 1], char *err, size_t errlen) {
    if (a->secret_file) {
        char secret[JOB_SECRET_MAX + 2];
        int rc = job_secret_file_read(a->secret_file, secret, sizeof secret, err, errlen) == 0 &&
                         job_key_from_secret(secret, a->job, key, err, errlen) == 0
                     ? 0
                     : -1;
        explicit_bzero(secret, sizeof secret);
        if (rc != 0) return -1;
        setenv(DP_ENV_JOB_KEY, key, 1);
    }
    return job_key_from_env(key, err, errlen);
}

int worker_exec(const WorkerArgs *a, const char *self_exe) {
    char err[1024], key[JOB_KEY_HEX_LEN + 1];
    redis_addr addr;
    if (redis_addr_parse(a->redis_url, &addr, err, sizeof err) != 0) { log_msg("%s", err); return DP_EXIT_BAD_JOB; }
    if (worker_job_key(a, key, err, sizeof err) != 0) { log_msg("%s", err); return DP_EXIT_BAD_JOB; }
    /* Redis away (stalled, restarting, failing over) is no bad job: tried again for a minute,
     * dp_init's bound before the job's own --control-wait is known; past it, FAILED (the
     * process may be started again), as dp_init would exit. */
    double deadline = now_ms() + 60000;
    ctl_t *c;
    for (int tries = 0; !(c = ctl_connect(&addr, a->job, 5000, err, sizeof err)); tries++) {
        if (!ctl_connect_error_transient() || now_ms() > deadline) {
            log_msg("%s", err);
            return ctl_connect_error_transient() ? DP_EXIT_FAILED : DP_EXIT_BAD_JOB;
        }
        if (tries == 0) log_msg("%s; trying again for up to 60 s", err);
        sleep_ms(200);
    }
    ctl_set_job_key(c, key); /* the program is run only from a config sealed with it */
    explicit_bzero(key, sizeof key);
    /* Heap, not stack: the config and the program are large. This process becomes the
     * program below, so they are never freed. */
    char *text = malloc(JOB_CONFIG_TEXT_MAX), *buf = malloc(sizeof ((JobConfig *)0)->program);
    JobConfig *cfg = malloc(sizeof *cfg);
    if (!text || !buf || !cfg) { log_msg("out of memory"); return DP_EXIT_BAD_JOB; }
    int got;
    while ((got = ctl_config_get(c, CFG_CONFIG, text, JOB_CONFIG_TEXT_MAX)) != 0 && ctl_error_transient(c) &&
           now_ms() < deadline)
        sleep_ms(200);
    if (got != 0) {
        int transient = ctl_error_transient(c);
        if (transient) log_msg("job '%s': redis at %s:%d did not answer: %s", a->job, addr.host, addr.port, ctl_last_error(c));
        else log_msg("job '%s' not found in redis at %s:%d: %s", a->job, addr.host, addr.port, ctl_last_error(c));
        ctl_close(c);
        return transient ? DP_EXIT_FAILED : DP_EXIT_BAD_JOB;
    }
    if (ctl_launcher_alive(c) == 0) {
        log_msg("job '%s' has no launcher running (its launcher key expired): it ended or its launcher died", a->job);
        ctl_close(c);
        return DP_EXIT_BAD_JOB;
    }
    ctl_close(c);
    if (job_config_parse_lines(cfg, text, err, sizeof err) != 0) { log_msg("job config: %s", err); return DP_EXIT_BAD_JOB; }
    char *argv[1100];
    if (program_argv(cfg, self_exe, buf, sizeof cfg->program, argv, 1100) < 1) { log_msg("job has no program"); return DP_EXIT_BAD_JOB; }
    /* The password travels in its own variable, never in the URL nor on a command line. */
    char url[4200];
    redis_addr_format(&addr, url, sizeof url);
    WorkerArgs env = *a;
    env.redis_url = url;
    worker_env_set(&env);
    if (addr.password[0]) setenv(DP_ENV_PASSWORD, addr.password, 1);
    fflush(NULL);
    execvp(argv[0], argv);
    log_msg("cannot run %s: %s", argv[0], strerror(errno));
    return DP_EXIT_BAD_JOB;
}
