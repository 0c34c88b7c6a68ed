/* main.c — the `deadpool` command line: `run` (launch a job) and `worker` (join one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int cmd_run(int argc, char **argv) {
    JobConfig cfg;
    job_config_defaults(&cfg);
    char err[1024];
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
