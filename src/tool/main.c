/* main.c — the `deadpool` command line: `run` (launch a job: the built-in GPT-2 trainer, or
 * any program after `--`), `worker` (join a job from another host), `train` (the
 * built-in trainer as a job's program, started by `run`), and `report` (report.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "control.h"
#include "launcher.h"
#include "report.h"
#include "runtime.h"
#include "secret.h"
#include "slurm.h"
#include "train_options.h"
#include "trainer.h"
#include "util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deadpool run [--workers N] [--spares S] [--steps K] [--seed X] [--out DIR] [options]\n"
            "                    [--model PRESET|FILE] [--data FILE] [trainer options]   (built-in GPT-2 trainer)\n"
            "       deadpool run [options] -- PROGRAM [ARGS...]                          (your training program)\n"
            "       deadpool run --nnodes N --nproc-per-node P --redis URL --job ID --secret-file FILE [--bind ADDR] [options]\n"
            "                    (the same command on every machine; machines beyond N are spare machines)\n"
            "       srun --ntasks-per-node=1 deadpool run [--spare-nodes K] [--nproc-per-node P] [options]\n"
            "                    (under Slurm: --nnodes, --job and the control plane come from the allocation)\n"
            "       deadpool worker --redis URL|--redis-file FILE --job ID --secret-file FILE [--spare] [--rank R] [--bind HOST]\n"
            "       deadpool report DIR [--output FILE]                                 (DIR/report.html of a job)\n"
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

/* Appends one argument to the job's program. 0, or -1 with a message. */
static int program_append(JobConfig *cfg, const char *arg) {
    size_t used = strlen(cfg->program), len = strlen(arg);
    if (strchr(arg, DP_ARG_SEP) || strchr(arg, '\n')) {
        fprintf(stderr, "deadpool: argument '%s' contains a control character\n", arg);
        return -1;
    }
    if (used + len + 2 > sizeof cfg->program) {
        fprintf(stderr, "deadpool: the program's arguments exceed %zu characters\n", sizeof cfg->program - 1);
        return -1;
    }
    if (used) cfg->program[used++] = DP_ARG_SEP;
    memcpy(cfg->program + used, arg, len + 1);
    return 0;
}

/* Sets a trainer option of the job's program: replaces its value where the program has it
 * already (resuming, the checkpoint's program has the first run's options: the program must
 * not depend on whether this machine had a checkpoint), else appends it. 0 / -1. */
static int program_set_option(JobConfig *cfg, const char *flag, const char *value) {
    char *p = cfg->program;
    while (p && *p) {
        char *end = strchr(p, DP_ARG_SEP);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (end && len == strlen(flag) && !strncmp(p, flag, len)) {
            char *v = end + 1, *vend = strchr(v, DP_ARG_SEP);
            char rest[sizeof cfg->program];
            snprintf(rest, sizeof rest, "%s", vend ? vend : "");
            size_t at = (size_t)(v - cfg->program);
            if (at + strlen(value) + strlen(rest) + 1 > sizeof cfg->program || strchr(value, DP_ARG_SEP) || strchr(value, '\n'))
                return program_append(cfg, flag) != 0 || program_append(cfg, value) != 0 ? -1 : 0;
            snprintf(v, sizeof cfg->program - at, "%s%s", value, rest);
            return 0;
        }
        p = end ? end + 1 : NULL;
    }
    return program_append(cfg, flag) != 0 || program_append(cfg, value) != 0 ? -1 : 0;
}

/* 1 if program (DP_ARG_SEP-joined) is the built-in trainer, with or without arguments. */
static int is_builtin(const char *program) {
    size_t n = strlen(DP_BUILTIN_PROGRAM);
    return !strncmp(program, DP_BUILTIN_PROGRAM, n) && (program[n] == 0 || program[n] == DP_ARG_SEP);
}

/* A program as a user reads it: arguments separated by spaces. */
static void program_text(const char *program, char *out, size_t len) {
    snprintf(out, len, "%s", program);
    for (char *p = out; *p; p++)
        if (*p == DP_ARG_SEP) *p = ' ';
}

/* --resume DIR: the job's config comes from DIR's newest complete checkpoint; options given on
 * the command line still apply on top of it. Its program does not: a file never names what
 * runs. The built-in trainer (this executable) resumes with the options it was given; any other
 * program must be given again after --, and is compared with the one the checkpoint names
 * (*ckpt_program; empty when no config was read here). */
static int load_resume_config(int argc, char **argv, JobConfig *cfg, char *ckpt_program, size_t plen, char *err,
                              size_t errlen, int slurm) {
    const char *dir = NULL;
    int machines = slurm;
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "--resume") && i + 1 < argc) dir = argv[i + 1];
        else if (!strncmp(argv[i], "--resume=", 9)) dir = argv[i] + 9;
        machines |= !strcmp(argv[i], "--nnodes") || !strncmp(argv[i], "--nnodes=", 9);
    }
    ckpt_program[0] = 0;
    if (!dir) return 0;
    /* Read (and later written) as this user, root maybe: nobody else may have put files here.
     * (A machine may have no such directory at all: it joins with the others' checkpoint.) */
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    if ((access(dir, F_OK) == 0 && dir_is_private(dir, err, errlen) != 0) ||
        (access(ck, F_OK) == 0 && dir_is_private(ck, err, errlen) != 0))
        return -1;
    int64_t step = checkpoint_latest_intact(dir, err, errlen);
    /* Across machines without a shared filesystem a machine holds part of a checkpoint (its
     * ranks' states and the job's config), or none at all: the machines together find the
     * step to resume (resume_choose), and a machine with nothing takes the job's options. */
    if (step < 0 && machines) step = checkpoint_latest_config(dir, err, errlen);
    if (step < 0 && machines) {
        fprintf(stderr, "deadpool: --resume %s: nothing on this machine (%s): it joins with the other machines' "
                "checkpoint\n", dir, err);
        snprintf(cfg->resume, sizeof cfg->resume, "%s", dir);
        return 0;
    }
    if (step < 0) return -1;
    char path[4200], text[32768], why[4400];
    checkpoint_path(path, sizeof path, dir, step, "config.txt");
    FILE *f = fopen_regular(path, why, sizeof why);
    if (!f) {
        snprintf(err, errlen, "%.1000s", why);
        return -1;
    }
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    if (n == 0 || n == sizeof text - 1) {
        snprintf(err, errlen, "%.900s: cannot read the checkpoint's job config (empty or over %zu bytes)", path,
                 sizeof text - 2);
        return -1;
    }
    text[n] = 0;
    if (job_config_parse_lines(cfg, text, err, errlen) != 0) return -1;
    snprintf(ckpt_program, plen, "%s", cfg->program);
    if (!is_builtin(cfg->program)) cfg->program[0] = 0; /* never run: only compared with the one after -- */
    snprintf(cfg->out, sizeof cfg->out, "%s", dir);
    snprintf(cfg->resume, sizeof cfg->resume, "%s", dir);
    /* The machine that wrote the checkpoint is not necessarily this one. */
    cfg->node_id[0] = 0;
    cfg->bind[0] = 0;
    /* Injected faults belong to the run that asked for them, not to its continuation. */
    cfg->inject[0] = 0;
    cfg->chaos = 0.0f;
    cfg->resume_step = (int)step;
    return 0;
}

/* 1 if the options before `--` include --NAME (or --NAME=...). */
static int has_option(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) && (argv[i][2 + n] == 0 || argv[i][2 + n] == '='))
            return 1;
    return 0;
}

/* The value of --NAME among the options before `--`, or NULL. */
static const char *option_value(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    const char *v = NULL;
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strncmp(argv[i], "--", 2) != 0 || strncmp(argv[i] + 2, name, n) != 0) continue;
        if (argv[i][2 + n] == '=') v = argv[i] + 3 + n;
        else if (argv[i][2 + n] == 0 && i + 1 < argc) v = argv[i + 1];
    }
    return v;
}

static const char *env_get(const char *name) { return getenv(name); }

/* What deadpool run's command line said, beside the job's config. */
typedef struct {
    TrainOptions topt; /* only to check the built-in trainer's options before anything starts */
    int builtin, workers_given, spares_given, redis_given, redis_file_given;
    SlurmGiven given;
} RunArgs;

static void run_help(void) {
    usage(stdout);
    printf("\noptions of deadpool run:\n");
    job_config_print_help();
    printf("  --redis-file FILE    the --redis URL, password included, read from FILE (one line; a regular file of this\n"
           "                       user's, mode 0600): the password never appears on a command line\n");
    printf("  --secret-file FILE   the secret the job's machines share (one line, 16 to %d characters, mode 0600):\n"
           "                       the job's keys come from it, never from Redis. Needed across machines (--nnodes)\n"
           "                       without Slurm; a job on one machine draws its own\n", JOB_SECRET_MAX);
    printf("\noptions of the built-in GPT-2 trainer (without -- PROGRAM):\n");
    train_options_print_help();
}

/* A requeued Slurm job (SLURM_RESTART_COUNT) resumes from each node's --out, as `--resume
 * OUT` would, unless the command line says --resume: *argv gets the option. 0 / -1. */
static int slurm_requeue_args(const SlurmEnv *slurm, const JobConfig *cfg, int *argc, char ***argv) {
    if (!slurm->in_step || slurm->restart_count <= 0 || has_option(*argc, *argv, "resume")) return 0;
    char **args = malloc(sizeof *args * (size_t)(*argc + 3)), **in = *argv;
    if (!args) { fprintf(stderr, "deadpool: out of memory\n"); return -1; }
    int k = 0;
    while (k < *argc && strcmp(in[k], "--") != 0) { args[k] = in[k]; k++; }
    const char *out = option_value(*argc, in, "out");
    args[k] = "--resume";
    args[k + 1] = (char *)(out ? out : cfg->out);
    for (int j = k; j < *argc; j++) args[j + 2] = in[j];
    *argc += 2;
    args[*argc] = NULL;
    *argv = args;
    log_msg("under Slurm: job %s was requeued (SLURM_RESTART_COUNT %d): resuming from %s", slurm->job_id,
            slurm->restart_count, args[k + 1]);
    return 0;
}

/* The options before `--` into cfg and ra. The index of `--` (argc if none), -1 after an
 * error (said), -2 after --help (printed). */
static int parse_run_options(int argc, char **argv, JobConfig *cfg, RunArgs *ra) {
    static char redis_file_url[4200], job_secret[JOB_SECRET_MAX + 2];
    char err[1024];
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--") != 0;) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            run_help();
            return -2;
        }
        /* flags: alone, --NAME means --NAME=1 */
        static const char *const FLAGS[] = {"report", "redis-ha", "fresh"};
        int flag = 0;
        for (size_t f = 0; f < sizeof FLAGS / sizeof FLAGS[0] && !flag; f++)
            flag = !strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, FLAGS[f]) &&
                   job_config_set(cfg, FLAGS[f], "1", err, sizeof err) == 0;
        if (flag) {
            i++;
            continue;
        }
        char name[64];
        const char *value;
        int used = split_option(argc, argv, i, name, sizeof name, &value);
        if (!used) return -1;
        i += used;
        if (!strcmp(name, "resume") || !strcmp(name, "resume-step")) continue;
        if (!strcmp(name, "redis-file")) { /* the URL, password and all, from a 0600 file: never on argv */
            if (redis_file_read(value, redis_file_url, sizeof redis_file_url, err, sizeof err) != 0) {
                fprintf(stderr, "deadpool: --redis-file %s\n", err);
                return -1;
            }
            int rc = job_config_set(cfg, "redis", redis_file_url, err, sizeof err);
            explicit_bzero(redis_file_url, sizeof redis_file_url);
            if (rc != 0) { fprintf(stderr, "deadpool: --redis-file: %s\n", err); return -1; }
            ra->redis_file_given = 1;
            continue;
        }
        if (!strcmp(name, "secret-file")) { /* the machines' shared secret: never on argv, never in Redis */
            if (job_secret_file_read(value, job_secret, sizeof job_secret, err, sizeof err) != 0) {
                fprintf(stderr, "deadpool: --secret-file %s\n", err);
                return -1;
            }
            cfg->job_secret = job_secret;
            continue;
        }
        ra->redis_given |= !strcmp(name, "redis");
        if (job_config_has(name)) {
            ra->workers_given |= !strcmp(name, "workers");
            ra->spares_given |= !strcmp(name, "spares");
            ra->given.nnodes |= !strcmp(name, "nnodes");
            ra->given.nproc_per_node |= !strcmp(name, "nproc-per-node");
            ra->given.job |= !strcmp(name, "job");
            if (job_config_set(cfg, name, value, err, sizeof err) != 0) { fprintf(stderr, "deadpool: %s\n", err); return -1; }
        } else if (train_options_has(name)) {
            char flag_name[80];
            snprintf(flag_name, sizeof flag_name, "--%s", name);
            if (train_options_set(&ra->topt, name, value, err, sizeof err) != 0) { fprintf(stderr, "deadpool: %s\n", err); return -1; }
            if (program_set_option(cfg, flag_name, value) != 0) return -1;
        } else {
            fprintf(stderr, "deadpool: unknown option --%s (see deadpool run --help)\n", name);
            return -1;
        }
    }
    return i;
}

/* `-- PROGRAM ARGS` at argv[i..argc) into cfg's program. 0 / -1 (said). */
static int program_after_dashes(int argc, char **argv, int i, JobConfig *cfg, RunArgs *ra) {
    if (i + 1 >= argc) { fprintf(stderr, "deadpool: expected a program after --\n"); return -1; }
    if (strcmp(cfg->program, DP_BUILTIN_PROGRAM) != 0 && cfg->resume[0] == 0) {
        fprintf(stderr, "deadpool: options of the built-in trainer (--model, --lr, ...) do not apply to a program after --\n");
        return -1;
    }
    cfg->program[0] = 0;
    ra->builtin = 0;
    for (int k = i + 1; k < argc; k++)
        if (program_append(cfg, argv[k]) != 0) return -1;
    /* A bare name is looked up on PATH by each process; a path must be there now. */
    if (strchr(argv[i + 1], '/') && access(argv[i + 1], X_OK) != 0) {
        fprintf(stderr, "deadpool: %s: not an executable file\n", argv[i + 1]);
        return -1;
    }
    return 0;
}

/* The checkpoint's program is never run from the file: the command line names it, and it
 * must be the one that wrote the checkpoint (its state is that program's). 0 / -1 (said). */
static int same_program_as_checkpoint(const JobConfig *cfg, const char *ckpt_program, int builtin) {
    int ckpt_builtin = is_builtin(ckpt_program);
    if (!cfg->resume[0] || !ckpt_program[0] || (ckpt_builtin ? builtin : !strcmp(cfg->program, ckpt_program))) return 0;
    char want[sizeof cfg->program], got[sizeof cfg->program];
    program_text(ckpt_builtin ? "(the built-in trainer)" : ckpt_program, want, sizeof want);
    program_text(cfg->program[0] ? cfg->program : "nothing", got, sizeof got);
    fprintf(stderr, "deadpool: --resume %s: the checkpoint was written by the program '%.2000s'; the command "
            "line gives %s%.2000s%s. DeadPool never runs a program named in a checkpoint: give that program "
            "again after -- (deadpool run --resume DIR -- PROGRAM ARGS)\n",
            cfg->resume, want, cfg->program[0] ? "'" : "", got, cfg->program[0] ? "'" : "");
    return -1;
}

/* A password in --redis would end up in every checkpoint's config.txt: it moves to the
 * environment the children inherit, and out of the URL. 0 / -1 (said). */
static int redis_password_out_of_url(JobConfig *cfg, const RunArgs *ra) {
    if (ra->redis_given && ra->redis_file_given) {
        fprintf(stderr, "deadpool: --redis and --redis-file: give one of them\n");
        return -1;
    }
    if (!cfg->redis[0]) return 0;
    char err[1024];
    redis_addr addr;
    if (redis_addr_parse(cfg->redis, &addr, err, sizeof err) != 0) { fprintf(stderr, "deadpool: --redis: %s\n", err); return -1; }
    if (strchr(cfg->redis, '@')) {
        if (!ra->redis_file_given)
            fprintf(stderr, "deadpool: --redis: a password on the command line is readable by every user of this "
                    "machine until it is overwritten (done at once, but not before); use %s or --redis-file FILE "
                    "(mode 0600) instead\n", DP_ENV_PASSWORD);
        setenv(DP_ENV_PASSWORD, addr.password, 1); /* children inherit it there, never on argv */
        redis_addr_format(&addr, cfg->redis, sizeof cfg->redis);
    }
    explicit_bzero(&addr, sizeof addr);
    return 0;
}

static int cmd_run(int argc, char **argv) {
    JobConfig cfg;
    job_config_defaults(&cfg);
    char err[1024], ckpt_program[sizeof cfg.program];
    /* Under srun (and not a one-machine job, --workers): one launcher per node, what the
     * command line leaves open comes from Slurm. */
    static SlurmEnv slurm;
    if (slurm_env_read(&slurm, env_get, err, sizeof err) != 0) {
        fprintf(stderr, "deadpool: under Slurm: %s\n", err);
        return 2;
    }
    if (has_option(argc, argv, "workers") && !has_option(argc, argv, "nnodes")) slurm.in_step = 0;
    if (has_option(argc, argv, "slurm")) {
        fprintf(stderr, "deadpool: unknown option --slurm (deadpool run reads Slurm's environment by itself)\n");
        return 2;
    }
    if (slurm_requeue_args(&slurm, &cfg, &argc, &argv) != 0) return 2;
    if (load_resume_config(argc, argv, &cfg, ckpt_program, sizeof ckpt_program, err, sizeof err, slurm.in_step) != 0) {
        fprintf(stderr, "deadpool: --resume: %s\n", err);
        return 2;
    }
    if (!slurm.in_step) { /* a checkpoint of a Slurm job, resumed by hand: the command line says where */
        cfg.slurm = 0;
        cfg.spare_nodes = 0;
    }
    RunArgs ra = {.builtin = is_builtin(cfg.program)};
    train_options_defaults(&ra.topt);
    int i = parse_run_options(argc, argv, &cfg, &ra);
    if (i == -2) return 0;
    if (i < 0) return 2;
    if (i < argc && program_after_dashes(argc, argv, i, &cfg, &ra) != 0) return 2;
    if (same_program_as_checkpoint(&cfg, ckpt_program, ra.builtin) != 0) return 2;
    if (redis_password_out_of_url(&cfg, &ra) != 0) return 2;
    if (slurm.in_step) {
        char said[1024];
        if (slurm_apply(&cfg, &slurm, &ra.given, said, sizeof said, err, sizeof err) != 0) {
            fprintf(stderr, "deadpool: under Slurm: %s\n", err);
            return 2;
        }
        cfg.slurm_env = &slurm;
        log_msg("under Slurm: %s", said);
    }
    /* Across machines the world is --nnodes x --nproc-per-node, and spares are whole spare
     * machines (the same command run on one more machine) unless --spares asks for more. */
    if (cfg.nnodes > 0 && !ra.workers_given) cfg.workers = cfg.nnodes * cfg.nproc_per_node;
    if (cfg.nnodes > 0 && !ra.spares_given) cfg.spares = 0;
    if (job_config_validate(&cfg, err, sizeof err) != 0 ||
        (ra.builtin && train_options_validate(&ra.topt, cfg.steps, cfg.workers, err, sizeof err) != 0)) {
        fprintf(stderr, "deadpool: %s\n", err);
        return 2;
    }
    return launcher_run(&cfg);
}

static int cmd_worker(int argc, char **argv) {
    WorkerArgs a = {.redis_url = NULL, .job = NULL, .spare = 0, .rank = -1, .bind_host = NULL};
    for (int i = 0; i < argc;) {
        if (strcmp(argv[i], "--spare") == 0) { a.spare = 1; i++; continue; }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { usage(stdout); return 0; }
        char name[64];
        const char *value;
        int used = split_option(argc, argv, i, name, sizeof name, &value);
        if (!used) return 2;
        if (strcmp(name, "redis") == 0) a.redis_url = value;
        else if (strcmp(name, "redis-file") == 0) { /* the URL with its password, from a 0600 file */
            static char url[4200];
            char err[1200];
            if (redis_file_read(value, url, sizeof url, err, sizeof err) != 0) {
                fprintf(stderr, "deadpool worker: --redis-file %s\n", err);
                return 2;
            }
            a.redis_url = url;
        }
        else if (strcmp(name, "secret-file") == 0) a.secret_file = value;
        else if (strcmp(name, "job") == 0) a.job = value;
        else if (strcmp(name, "bind") == 0) a.bind_host = value;
        else if (strcmp(name, "rank") == 0) {
            char *end;
            long r = strtol(value, &end, 10);
            if (*end || r < 0 || r >= DP_MAX_RANKS) {
                fprintf(stderr, "deadpool worker: --rank: expected an integer in [0, %d), found '%s'\n", DP_MAX_RANKS, value);
                return 2;
            }
            a.rank = (int)r;
        } else {
            fprintf(stderr, "deadpool worker: unknown option --%s\n", name);
            return 2;
        }
        i += used;
    }
    if (!a.redis_url || !a.job) {
        fprintf(stderr, "deadpool worker: --redis URL (or --redis-file FILE) and --job ID are required\n");
        usage(stderr);
        return 2;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    return worker_exec(&a, self);
}

/* A Python program of the job (python/deadpool) finds its package and libdeadpool beside this
 * binary: in a build tree ./python and build/libdeadpool.so, in an install PREFIX/lib. What the
 * environment already names wins: PYTHONPATH is prepended to, DEADPOOL_LIB is kept. */
static void python_env(void) {
    char self[4096], path[4200], lib[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return;
    *slash = 0;
    snprintf(path, sizeof path, "%s/python", self);
    snprintf(lib, sizeof lib, "%s/build/libdeadpool.so", self);
    char probe[4300];
    snprintf(probe, sizeof probe, "%s/deadpool/__init__.py", path);
    if (access(probe, R_OK) != 0) { /* an install: PREFIX/bin/deadpool */
        snprintf(path, sizeof path, "%s/../lib/python3/dist-packages", self);
        snprintf(lib, sizeof lib, "%s/../lib/libdeadpool.so", self);
        snprintf(probe, sizeof probe, "%s/deadpool/__init__.py", path);
        if (access(probe, R_OK) != 0) return;
    }
    const char *old = getenv("PYTHONPATH");
    char *joined = malloc(strlen(path) + (old ? strlen(old) : 0) + 2);
    if (!joined) return;
    sprintf(joined, "%s%s%s", path, old && *old ? ":" : "", old && *old ? old : "");
    setenv("PYTHONPATH", joined, 1);
    free(joined);
    if (!getenv("DEADPOOL_LIB") && access(lib, R_OK) == 0) setenv("DEADPOOL_LIB", lib, 0);
}

/* A password in a --redis URL is on this process's command line, which every user of the
 * machine can read (/proc/PID/cmdline, ps) until it is overwritten: that is done here, first
 * thing, and the options are read from a copy. (Before this line runs it is visible: use
 * DEADPOOL_REDIS_PASSWORD or --redis-file.) */
static char **scrub_argv(int argc, char **argv) {
    char **copy = calloc((size_t)argc + 1, sizeof *copy);
    if (!copy) return argv;
    for (int i = 0; i < argc; i++)
        if (!(copy[i] = strdup(argv[i]))) return argv;
    for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "--redis") && i + 1 < argc) redis_url_scrub(argv[i + 1]);
        else if (!strncmp(argv[i], "--redis=", 8)) redis_url_scrub(argv[i] + 8);
    }
    return copy;
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    argv = scrub_argv(argc, argv);
    if (!strcmp(argv[1], "run") || !strcmp(argv[1], "worker")) python_env();
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(argv[1], "worker") == 0) return cmd_worker(argc - 2, argv + 2);
    if (strcmp(argv[1], "train") == 0) return gpt2_main(argc - 2, argv + 2);
    if (strcmp(argv[1], "report") == 0) return report_main(argc - 2, argv + 2);
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "deadpool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
