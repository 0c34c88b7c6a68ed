/* main.c — the `deadpool` command line: `run` (launch a job) and `worker` (join one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "launcher.h"
#include "util.h"
#include "worker.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deadpool run [--workers N] [--spares S] [--model PRESET|FILE] [--data FILE]\n"
            "                    [--steps K] [--seed X] [--out DIR] [--redis URL] [options]\n"
            "       deadpool worker --redis URL --job ID [--spare] [--rank R] [--bind HOST]\n"
            "       deadpool run --help     (every option with its default)\n");
}

/* Splits "--name=value" / "--name value"; returns the number of argv entries used, 0 on error. */
static int split_option(int argc, char **argv, int i, char *name, size_t nlen, const char **value) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0) {
        fprintf(stderr, "deadpool: unexpected argument '%s'\n", arg);
        return 0;
    }
    const char *eq = strchr(arg, '=');
    if (eq) {
        snprintf(name, nlen, "%.*s", (int)(eq - arg - 2), arg + 2);
        *value = eq + 1;
        return 1;
    }
    snprintf(name, nlen, "%s", arg + 2);
    if (i + 1 >= argc) {
        fprintf(stderr, "deadpool: option --%s needs a value\n", name);
        return 0;
    }
    *value = argv[i + 1];
    return 2;
}

/* --resume DIR: the job's config comes from DIR's newest complete checkpoint; options given
 * on the command line still apply on top of it. */
static int load_resume_config(int argc, char **argv, JobConfig *cfg, char *err, size_t errlen) {
    const char *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--resume") && i + 1 < argc) dir = argv[i + 1];
        else if (!strncmp(argv[i], "--resume=", 9)) dir = argv[i] + 9;
    }
    if (!dir) return 0;
    int64_t step = checkpoint_latest(dir, err, errlen);
    if (step < 0) return -1;
    char path[4200];
    static char text[65536];
    checkpoint_path(path, sizeof path, dir, step, "config.txt");
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    if (!f || n == 0) { snprintf(err, errlen, "%.900s: cannot read the checkpoint's job config", path); return -1; }
    text[n] = 0;
    if (job_config_parse_lines(cfg, text, err, errlen) != 0) return -1;
    snprintf(cfg->out, sizeof cfg->out, "%s", dir);
    snprintf(cfg->resume, sizeof cfg->resume, "%s", dir);
    /* Injected faults belong to the run that asked for them, not to its continuation. */
    cfg->inject[0] = 0;
    cfg->chaos = 0.0f;
    cfg->resume_step = (int)step;
    return 0;
}

static int cmd_run(int argc, char **argv) {
    JobConfig cfg;
    job_config_defaults(&cfg);
    char err[1024];
    if (load_resume_config(argc, argv, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "deadpool: --resume: %s\n", err);
        return 2;
    }
    for (int i = 0; i < argc;) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            printf("\noptions of deadpool run:\n");
            job_config_print_help();
            return 0;
        }
        char name[64];
        const char *value;
        int used = split_option(argc, argv, i, name, sizeof name, &value);
        if (!used) return 2;
        if (!strcmp(name, "resume") || !strcmp(name, "resume-step")) { i += used; continue; }
        if (job_config_set(&cfg, name, value, err, sizeof err) != 0) {
            fprintf(stderr, "deadpool: %s\n", err);
            return 2;
        }
        i += used;
    }
    if (job_config_validate(&cfg, err, sizeof err) != 0) {
        fprintf(stderr, "deadpool: %s\n", err);
        return 2;
    }
    return launcher_run(&cfg);
}

static int cmd_worker(int argc, char **argv) {
    WorkerArgs a = {.redis_url = NULL, .job = NULL, .spare = 0, .rank = -1, .bind_host = "127.0.0.1"};
    for (int i = 0; i < argc;) {
        if (strcmp(argv[i], "--spare") == 0) { a.spare = 1; i++; continue; }
        char name[64];
        const char *value;
        int used = split_option(argc, argv, i, name, sizeof name, &value);
        if (!used) return 2;
        if (strcmp(name, "redis") == 0) a.redis_url = value;
        else if (strcmp(name, "job") == 0) a.job = value;
        else if (strcmp(name, "bind") == 0) a.bind_host = value;
        else if (strcmp(name, "rank") == 0) {
            char *end;
            long r = strtol(value, &end, 10);
            if (*end || r < 0 || r > 1 << 20) { fprintf(stderr, "deadpool worker: --rank: expected an integer >= 0, found '%s'\n", value); return 2; }
            a.rank = (int)r;
        } else {
            fprintf(stderr, "deadpool worker: unknown option --%s\n", name);
            return 2;
        }
        i += used;
    }
    if (!a.redis_url || !a.job) {
        fprintf(stderr, "deadpool worker: --redis URL and --job ID are required\n");
        usage(stderr);
        return 2;
    }
    return worker_main(&a);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(argv[1], "worker") == 0) return cmd_worker(argc - 2, argv + 2);
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "deadpool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
