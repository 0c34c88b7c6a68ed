/* test_config.c — option parsing, validation, and the serialisation workers read back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"
#include "inject.h"
#include "optimizer.h"
#include "recovery.h"
#include "runtime.h"
#include "slurm.h"
#include "train_options.h"

static void test_roundtrip(void) {
    JobConfig a, b;
    char err[512], text[65536];
    job_config_defaults(&a);
    CHECK(job_config_set(&a, "workers", "3", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "chaos", "0.000123456789", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "seed", "18446744073709551615", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "out", "/some where/x", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "ft", "disk", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "ckpt-every", "3", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "inject", "kill:1@3", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "inject", "stop:2@4", err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(a.inject, "kill:1@3,stop:2@4"), "repeated --inject appends: '%s'", a.inject);
    CHECK(job_config_serialize(&a, text, sizeof text) == 0, "serialize");
    CHECK(job_config_parse_lines(&b, text, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "config differs after round trip");
}

static void test_bad_values_named(void) {
    JobConfig c;
    char err[512];
    job_config_defaults(&c);
    CHECK(job_config_set(&c, "steps", "abc", err, sizeof err) != 0 && strstr(err, "--steps") && strstr(err, "abc"), "%s", err);
    CHECK(job_config_set(&c, "workers", "0", err, sizeof err) != 0 && strstr(err, "--workers"), "%s", err);
    CHECK(job_config_set(&c, "seed", "-1", err, sizeof err) != 0 && strstr(err, "--seed"), "%s", err);
    CHECK(job_config_set(&c, "bogus", "1", err, sizeof err) != 0 && strstr(err, "--bogus"), "%s", err);
    CHECK(job_config_set(&c, "workers", "1025", err, sizeof err) != 0 && strstr(err, "--workers") && strstr(err, "1024"),
          "one limit for --workers and every per-rank array: %s", err);
    CHECK(job_config_set(&c, "ft", "cloud", err, sizeof err) != 0 && strstr(err, "--ft") && strstr(err, "deadpool, disk, none"),
          "%s", err);
    CHECK(job_config_set(&c, "chaos", "nan", err, sizeof err) != 0 && strstr(err, "--chaos"), "non-finite: %s", err);
    CHECK(job_config_set(&c, "inject", "kill:7@2", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) != 0 && strstr(err, "kill:7@2") && strstr(err, "found 7"),
          "a fault for a rank the job does not have: %s", err);
    job_config_defaults(&c);
    CHECK(job_config_set(&c, "snapshot-every", "0", err, sizeof err) != 0 && strstr(err, "--snapshot-every"), "%s", err);
    CHECK(job_config_set(&c, "snapshot-every", "4", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&c, "persist-every", "6", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) != 0 && strstr(err, "--persist-every") && strstr(err, "(4)") &&
              strstr(err, "found 6"),
          "%s", err);
    CHECK(job_config_set(&c, "persist-every", "8", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) == 0, "%s", err);
}

static void test_train_options(void) {
    TrainOptions o;
    char err[512];
    train_options_defaults(&o);
    char *args[] = {"--model", "small", "--lr=3e-4", "--warmup", "50"};
    CHECK(train_options_parse_args(&o, 5, args, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(o.model, "small") && o.lr == 3e-4f && o.warmup == 50, "parsed %s %g %d", o.model, o.lr, o.warmup);
    CHECK(train_options_validate(&o, 10, 4, err, sizeof err) != 0 && strstr(err, "--warmup"), "%s", err);
    /* the layout: small has 6 heads and 6 layers */
    o.warmup = 0;
    CHECK(train_options_validate(&o, 10, 4, err, sizeof err) == 0, "%s", err);
    o.tp = 2, o.pp = 2;
    CHECK(train_options_validate(&o, 10, 8, err, sizeof err) == 0, "tp 2 x pp 2 of 8 ranks: %s", err);
    CHECK(train_options_validate(&o, 10, 6, err, sizeof err) != 0 && strstr(err, "--tp 2 x --pp 2"), "of 6 ranks: %s", err);
    o.tp = 4, o.pp = 1;
    CHECK(train_options_validate(&o, 10, 4, err, sizeof err) != 0 && strstr(err, "--tp: expected a divisor of the model's 6"),
          "tp 4 of 6 heads: %s", err);
    o.tp = 1, o.pp = 8;
    CHECK(train_options_validate(&o, 10, 8, err, sizeof err) != 0 && strstr(err, "--pp: expected at most the model's 6"),
          "pp 8 of 6 layers: %s", err);
    o.pp = 1;
    CHECK(train_options_set(&o, "lr", "nan", err, sizeof err) != 0 && strstr(err, "--lr") && strstr(err, "nan"), "%s", err);
    CHECK(train_options_set(&o, "lr", "inf", err, sizeof err) != 0, "inf accepted");
    CHECK(train_options_has("model") && !train_options_has("workers") && job_config_has("workers") &&
              !job_config_has("model"),
          "each option belongs to one table");
}

static void test_inject_grammar(void) {
    FaultSpec f[INJECT_MAX];
    char err[256];
    int n = inject_parse("kill:2@10,stop:1@8,netdown:3@12,rkill:2@1", 4, f, INJECT_MAX, err, sizeof err);
    CHECK(n == 4, "%d: %s", n, err);
    CHECK(f[0].kind == FAULT_KILL && f[0].rank == 2 && f[0].at == 10 && f[3].kind == FAULT_RKILL && f[3].at == 1, "fields");
    CHECK(inject_parse("boom:1@2", 4, f, INJECT_MAX, err, sizeof err) < 0 && strstr(err, "boom"), "%s", err);
    /* Steps are 1-based in --inject (as in the progress line and ckpt/step_N): step 0 is
     * refused with a message that says so, and so is epoch 0 for rkill. */
    CHECK(inject_parse("kill:2@0", 4, f, INJECT_MAX, err, sizeof err) < 0 && strstr(err, "kill:2@0") &&
              strstr(err, "steps start at 1"), "%s", err);
    CHECK(inject_parse("corrupt:1@3,stop:1@0", 4, f, INJECT_MAX, err, sizeof err) < 0 && strstr(err, "stop:1@0") &&
              !strstr(err, "corrupt") && strstr(err, "steps start at 1"), "%s", err);
    CHECK(inject_parse("rkill:1@-1", 4, f, INJECT_MAX, err, sizeof err) < 0 && strstr(err, "expected an epoch >= 0"),
          "%s", err);
    CHECK(inject_parse("rkill:1@0", 4, f, INJECT_MAX, err, sizeof err) == 1 && f[0].kind == FAULT_RKILL && f[0].at == 0,
          "rkill at the start (epoch 0): %s", err);
    CHECK(inject_parse("corrupt:3@1", 4, f, INJECT_MAX, err, sizeof err) == 1 && f[0].kind == FAULT_CORRUPT && f[0].at == 1,
          "%s", err);
    CHECK(inject_parse("kill:1@2;x", 4, f, INJECT_MAX, err, sizeof err) < 0 && strstr(err, ";x"), "%s", err);
    CHECK(inject_netdown_rank("kill:1@2,netdown:3@4") == 3 && inject_netdown_rank("kill:1@2") == -1, "netdown rank");
}

/* `deadpool run --help` names every --inject kind and says how steps are numbered. */
static void test_help_inject(void) {
    char path[] = "/tmp/test_config_help_XXXXXX";
    int fd = mkstemp(path), saved = dup(1);
    CHECK(fd >= 0 && saved >= 0, "temporary file");
    if (fd < 0 || saved < 0) return;
    fflush(stdout);
    dup2(fd, 1);
    job_config_print_help();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char text[16384] = "";
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    text[got > 0 ? got : 0] = 0;
    const char *inject = strstr(text, "\n  --inject ");
    if (inject) inject++;
    CHECK(inject != NULL, "no --inject in the help");
    if (!inject) return;
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(inject, "\n"), inject);
    const char *kinds[] = {"kill", "stop", "netdown", "corrupt", "rkill"};
    for (int i = 0; i < 5; i++) CHECK(strstr(line, kinds[i]) != NULL, "--inject help lacks %s: %s", kinds[i], line);
    CHECK(strstr(line, "1-based"), "--inject help does not say steps are 1-based: %s", line);
}

static void test_holder_list_grammar(void) {
    Holder h[HOLDERS_MAX] = {{7, "127.0.0.1", 4000}, {12, "node-b.example", 65535}}, back[HOLDERS_MAX];
    char text[HOLDERS_TEXT_MAX];
    CHECK(holders_format(h, 2, text, sizeof text) == 0 && !strcmp(text, "7@127.0.0.1:4000,12@node-b.example:65535"), "%s", text);
    int n = holders_parse(text, back, HOLDERS_MAX);
    CHECK(n == 2 && back[1].proc == 12 && back[1].port == 65535 && !strcmp(back[1].host, "node-b.example"), "parsed %d", n);
    CHECK(holders_parse("", back, HOLDERS_MAX) == 0, "empty list");
    CHECK(holders_parse("7@host", back, HOLDERS_MAX) < 0 && holders_parse("x@h:1", back, HOLDERS_MAX) < 0 &&
              holders_parse("7@h:99999", back, HOLDERS_MAX) < 0,
          "malformed lists are refused");
    char small[10];
    CHECK(holders_format(h, 2, small, sizeof small) != 0, "a list that does not fit is an error");
}

static void test_program_argv(void) {
    JobConfig c;
    job_config_defaults(&c);
    char buf[sizeof c.program], *argv[16];
    snprintf(c.program, sizeof c.program, "%s%c--model%csmall", DP_BUILTIN_PROGRAM, DP_ARG_SEP, DP_ARG_SEP);
    int n = program_argv(&c, "/bin/deadpool", buf, sizeof buf, argv, 16);
    CHECK(n == 4 && !strcmp(argv[0], "/bin/deadpool") && !strcmp(argv[1], "train") && !strcmp(argv[3], "small") &&
              argv[4] == NULL,
          "built-in trainer: %d", n);
    snprintf(c.program, sizeof c.program, "build/examples/mlp%c--x y", DP_ARG_SEP);
    n = program_argv(&c, "/bin/deadpool", buf, sizeof buf, argv, 16);
    CHECK(n == 2 && !strcmp(argv[0], "build/examples/mlp") && !strcmp(argv[1], "--x y"), "program: %d", n);
}

static void test_lr_schedule(void) {
    AdamWConfig o = adamw_defaults();
    o.lr = 1.0f;
    o.warmup_steps = 10;
    o.total_steps = 110;
    o.final_lr_frac = 0.1f;
    CHECK(adamw_lr(&o, 0) == 0.1f, "%g", adamw_lr(&o, 0));
    CHECK(adamw_lr(&o, 9) == 1.0f, "%g", adamw_lr(&o, 9));
    CHECK(adamw_lr(&o, 10) == 1.0f, "%g", adamw_lr(&o, 10));
    float mid = adamw_lr(&o, 60);
    CHECK(mid > 0.54f && mid < 0.56f, "%g", mid);
    CHECK(adamw_lr(&o, 110) > 0.0999f && adamw_lr(&o, 110) < 0.1001f, "%g", adamw_lr(&o, 110));
}

static void test_adamw_matches_reference(void) {
    AdamWConfig o = adamw_defaults();
    o.beta1 = 0.9f; o.beta2 = 0.999f; o.eps = 1e-8f; o.weight_decay = 0.1f;
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m[2] = {0}, v[2] = {0};
    float p2[2], m2[2], v2[2]; /* out of place gives the same bits as in place */
    adamw_update(p2, p, g, m2, m, v2, v, 2, &o, 0.01f, 1.0f, 1);
    adamw_update(p, p, g, m, m, v, v, 2, &o, 0.01f, 1.0f, 1);
    CHECK(memcmp(p, p2, sizeof p) == 0 && memcmp(m, m2, sizeof m) == 0 && memcmp(v, v2, sizeof v) == 0, "out of place differs");
    /* first step: mhat = g, vhat = g^2, so the update is lr * (sign(g) + wd * p) */
    CHECK(p[0] > 1.0f - 0.01f * (1.0f + 0.1f) - 1e-6f && p[0] < 1.0f - 0.01f * (1.0f + 0.1f) + 1e-6f, "%.8f", p[0]);
    CHECK(p[1] > -2.0f + 0.01f * (1.0f + 0.2f) - 1e-6f && p[1] < -2.0f + 0.01f * (1.0f + 0.2f) + 1e-6f, "%.8f", p[1]);
    double n = grad_global_norm(g, 2);
    CHECK(n > 0.559016 && n < 0.559017, "%.7f", n);
    o.grad_clip = 0.5f;
    CHECK(grad_clip_scale(&o, 2.0) == 0.25f, "clip");
    CHECK(grad_clip_scale(&o, 0.3) == 1.0f, "no clip");
}

/* Machines of one job must agree on every option but their own (--out, --bind, ...). */
static void test_node_options(void) {
    JobConfig a, b;
    char err[512], ta[JOB_CONFIG_TEXT_MAX], tb[JOB_CONFIG_TEXT_MAX];
    job_config_defaults(&a);
    job_config_set(&a, "nnodes", "2", err, sizeof err);
    job_config_set(&a, "nproc-per-node", "2", err, sizeof err);
    job_config_set(&a, "workers", "4", err, sizeof err);
    job_config_set(&a, "redis", "redis://10.0.0.1:6379", err, sizeof err);
    job_config_set(&a, "job", "j1", err, sizeof err);
    CHECK(job_config_validate(&a, err, sizeof err) == 0, "valid: %s", err);
    b = a;
    snprintf(b.out, sizeof b.out, "/other");
    snprintf(b.bind, sizeof b.bind, "10.0.0.2");
    snprintf(b.node_id, sizeof b.node_id, "m2");
    job_config_serialize(&a, ta, sizeof ta);
    job_config_serialize(&b, tb, sizeof tb);
    CHECK(job_config_mismatch(tb, ta, err, sizeof err) == 0, "machine-local options may differ: %s", err);
    b.steps = 7;
    job_config_serialize(&b, tb, sizeof tb);
    CHECK(job_config_mismatch(tb, ta, err, sizeof err) != 0 && strstr(err, "--steps") && strstr(err, "'7'") &&
              strstr(err, "'100'"), "steps differ, named with both values: %s", err);
    /* what a multi-node job needs, named */
    b = a;
    b.redis[0] = 0;
    CHECK(job_config_validate(&b, err, sizeof err) != 0 && strstr(err, "--redis"), "no redis: %s", err);
    b = a;
    b.job[0] = 0;
    CHECK(job_config_validate(&b, err, sizeof err) != 0 && strstr(err, "--job"), "no job: %s", err);
    b = a;
    b.workers = 5;
    CHECK(job_config_validate(&b, err, sizeof err) != 0 && strstr(err, "--nnodes x --nproc-per-node"), "world: %s", err);
    b = a;
    snprintf(b.job, sizeof b.job, "a:b");
    CHECK(job_config_validate(&b, err, sizeof err) != 0 && strstr(err, "--job"), "job name: %s", err);
}

/* Replica holders: one per other machine first (same local rank), then the rest of the ring. */
static void test_holder_offsets(void) {
    int off[7];
    holder_offsets(8, 2, off);
    int want[7] = {2, 4, 6, 1, 3, 5, 7};
    for (int i = 0; i < 7; i++) CHECK(off[i] == want[i], "8 ranks, 2 per machine: offset %d is %d, expected %d", i, off[i], want[i]);
    holder_offsets(4, 0, off);
    for (int i = 0; i < 3; i++) CHECK(off[i] == i + 1, "one machine: the plain ring (%d: %d)", i, off[i]);
    holder_offsets(4, 4, off);
    for (int i = 0; i < 3; i++) CHECK(off[i] == i + 1, "every rank on one machine: the plain ring (%d: %d)", i, off[i]);
}

/* Holders outside the rank's pipeline stage first: tp 2 x pp 2 x dp 2 (block = tp x dp = 4). */
static void test_holder_order(void) {
    int o[7];
    holder_order(8, 0, 4, 1, o); /* one machine: the ring 2..7 0, stage 1 (4..7) first */
    int want1[7] = {4, 5, 6, 7, 2, 3, 0};
    for (int i = 0; i < 7; i++) CHECK(o[i] == want1[i], "rank 1, entry %d: %d, expected %d", i, o[i], want1[i]);
    holder_order(8, 2, 4, 6, o); /* 2 per machine: offsets 2 4 6 1 3 5 7, stage 0 (0..3) first */
    int want6[7] = {0, 2, 1, 3, 4, 7, 5};
    for (int i = 0; i < 7; i++) CHECK(o[i] == want6[i], "rank 6, entry %d: %d, expected %d", i, o[i], want6[i]);
    holder_order(4, 0, 0, 2, o); /* no blocks: the plain ring */
    CHECK(o[0] == 3 && o[1] == 0 && o[2] == 1, "ring of rank 2: %d %d %d", o[0], o[1], o[2]);
}

/* Slurm hostlists: ranges, lists, zero padding, several bracket groups; malformed ones named. */
static void test_slurm_hostlist(void) {
    static char h[DP_MAX_RANKS][SLURM_HOST_MAX];
    char err[512];
    int n = slurm_hostlist_expand("node[1-3,5]", h, DP_MAX_RANKS, err, sizeof err);
    CHECK(n == 4 && !strcmp(h[0], "node1") && !strcmp(h[2], "node3") && !strcmp(h[3], "node5"), "node[1-3,5]: %d %s", n, err);
    n = slurm_hostlist_expand("a[08-10]x,b,c[1]", h, DP_MAX_RANKS, err, sizeof err);
    CHECK(n == 5 && !strcmp(h[0], "a08x") && !strcmp(h[1], "a09x") && !strcmp(h[2], "a10x") && !strcmp(h[3], "b") &&
              !strcmp(h[4], "c1"), "padding, suffix, plain names: %d %s %s", n, n > 0 ? h[0] : "", err);
    n = slurm_hostlist_expand("r[1-2]n[1-2]", h, DP_MAX_RANKS, err, sizeof err);
    CHECK(n == 4 && !strcmp(h[0], "r1n1") && !strcmp(h[1], "r1n2") && !strcmp(h[2], "r2n1") && !strcmp(h[3], "r2n2"),
          "two groups: %d %s", n, err);
    n = slurm_hostlist_expand("node7", h, DP_MAX_RANKS, err, sizeof err);
    CHECK(n == 1 && !strcmp(h[0], "node7"), "one name: %d", n);
    const char *bad[] = {"node[1-3", "node1-3]", "node[3-1]", "node[]", "node[a-b]", "node[1,]", "a,,b", "a,", "", "n[[1]]",
                         "node[1-2000]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        n = slurm_hostlist_expand(bad[i], h, DP_MAX_RANKS, err, sizeof err);
        CHECK(n < 0 && strstr(err, "hostlist"), "'%s' is refused with a reason: %d '%s'", bad[i], n, err);
    }
}

/* A fake environment for slurm_env_read. */
static const char *const *fake_env;
static const char *fake_get(const char *name) {
    for (int i = 0; fake_env[i]; i += 2)
        if (!strcmp(fake_env[i], name)) return fake_env[i + 1];
    return NULL;
}

/* Slurm's environment fills what the command line left open; explicit options win. */
static void test_slurm_env(void) {
    static SlurmEnv s;
    char err[512], said[1024];
    const char *none[] = {"HOME", "/root", NULL};
    fake_env = none;
    CHECK(slurm_env_read(&s, fake_get, err, sizeof err) == 0 && !s.in_step, "not under Slurm");
    const char *env[] = {"SLURM_JOB_ID", "42", "SLURM_NODEID", "2", "SLURM_STEP_NUM_NODES", "3", "SLURM_STEP_NODELIST",
                         "node[1-2,4]", "SLURM_STEP_NUM_TASKS", "3", "SLURM_RESTART_COUNT", "1", NULL};
    fake_env = env;
    CHECK(slurm_env_read(&s, fake_get, err, sizeof err) == 0 && s.in_step && s.nnodes == 3 && s.node == 2 &&
              s.restart_count == 1 && s.nhosts == 3 && !strcmp(s.hosts[2], "node4") && !strcmp(s.job_id, "42"),
          "a step: %s", err);
    JobConfig c;
    job_config_defaults(&c);
    c.spare_nodes = 1;
    SlurmGiven given = {0};
    CHECK(slurm_apply(&c, &s, &given, said, sizeof said, err, sizeof err) == 0 && c.nnodes == 2 && c.nproc_per_node == 1 &&
              !strcmp(c.job, "42") && c.slurm == 1, "applied: %s", err);
    CHECK(strstr(said, "--job 42") && strstr(said, "--nnodes 2") && strstr(said, "node 2 (node4)"), "said: %s", said);
    c.workers = c.nnodes * c.nproc_per_node;
    c.spares = 0;
    CHECK(job_config_validate(&c, err, sizeof err) == 0, "valid without --redis under Slurm: %s", err);
    /* explicit options win */
    job_config_defaults(&c);
    snprintf(c.job, sizeof c.job, "mine");
    c.nnodes = 3;
    c.nproc_per_node = 2;
    SlurmGiven all = {.nnodes = 1, .nproc_per_node = 1, .job = 1};
    CHECK(slurm_apply(&c, &s, &all, said, sizeof said, err, sizeof err) == 0 && c.nnodes == 3 && c.nproc_per_node == 2 &&
              !strcmp(c.job, "mine") && !strstr(said, "--job"), "explicit: %s", said);
    /* too many spare nodes; more than one task per node */
    job_config_defaults(&c);
    c.spare_nodes = 3;
    CHECK(slurm_apply(&c, &s, &given, said, sizeof said, err, sizeof err) != 0 && strstr(err, "--spare-nodes"), "%s", err);
    s.ntasks = 6;
    job_config_defaults(&c);
    CHECK(slurm_apply(&c, &s, &given, said, sizeof said, err, sizeof err) != 0 && strstr(err, "--ntasks-per-node=1"), "%s", err);
    /* one node: a one-machine job (no --nnodes, no Slurm control plane), its ranks the node's */
    const char *one[] = {"SLURM_JOB_ID", "43", "SLURM_NODEID", "0", "SLURM_STEP_NUM_NODES", "1", "SLURM_STEP_NODELIST",
                         "node1", "SLURM_STEP_NUM_TASKS", "1", NULL};
    fake_env = one;
    CHECK(slurm_env_read(&s, fake_get, err, sizeof err) == 0 && s.in_step && s.nnodes == 1, "one node: %s", err);
    job_config_defaults(&c);
    c.nproc_per_node = 3;
    CHECK(slurm_apply(&c, &s, &given, said, sizeof said, err, sizeof err) == 0 && c.nnodes == 0 && !c.slurm &&
              c.workers == 3 && !strcmp(c.job, "43") && strstr(said, "one-machine job") && strstr(said, "warning"),
          "one node: %s / %s", err, said);
    CHECK(job_config_validate(&c, err, sizeof err) == 0, "a one-node job valid: %s", err);
    /* broken variables are named */
    const char *bad[] = {"SLURM_JOB_ID", "42", "SLURM_NODEID", "3", "SLURM_STEP_NUM_NODES", "3", "SLURM_STEP_NODELIST",
                         "node[1-3]", NULL};
    fake_env = bad;
    CHECK(slurm_env_read(&s, fake_get, err, sizeof err) != 0 && strstr(err, "SLURM_NODEID"), "%s", err);
    const char *bad2[] = {"SLURM_JOB_ID", "42", "SLURM_NODEID", "0", "SLURM_NNODES", "2", "SLURM_JOB_NODELIST",
                          "node[1-3]", NULL};
    fake_env = bad2;
    CHECK(slurm_env_read(&s, fake_get, err, sizeof err) != 0 && strstr(err, "names 3 nodes"), "%s", err);
    /* --spare-nodes outside Slurm is refused */
    job_config_defaults(&c);
    c.spare_nodes = 1;
    CHECK(job_config_validate(&c, err, sizeof err) != 0 && strstr(err, "--spare-nodes"), "%s", err);
}

/* The control plane's ports: a function of secret and job, on an 8-port grid, all five below
 * the kernel's ephemeral range (an outgoing connection's local port must never hold one). */
static void test_slurm_plane_port(void) {
    int lo = 1 << 30, hi = 0, differ = 0;
    for (int j = 0; j < 2000; j++) {
        char job[16], secret[65];
        snprintf(job, sizeof job, "%d", j);
        snprintf(secret, sizeof secret, "%064d", j % 7);
        int p = slurm_plane_port(job, secret);
        CHECK(p == slurm_plane_port(job, secret), "job %d: the same inputs give the same port", j);
        CHECK(p >= SLURM_PORT_BASE && (p - SLURM_PORT_BASE) % 8 == 0 && p + 4 < 32768, "job %d: port %d", j, p);
        if (p < lo) lo = p;
        if (p > hi) hi = p;
        snprintf(secret, sizeof secret, "%064d", j % 7 + 1);
        differ += slurm_plane_port(job, secret) != p;
    }
    CHECK(hi - lo > 8 * SLURM_PORT_SLOTS / 2, "spread: %d..%d", lo, hi);
    CHECK(differ > 1900, "another secret, another port: %d of 2000", differ);
}

int main(void) {
    RUN_TEST(test_slurm_hostlist);
    RUN_TEST(test_slurm_plane_port);
    RUN_TEST(test_slurm_env);
    RUN_TEST(test_node_options);
    RUN_TEST(test_holder_offsets);
    RUN_TEST(test_holder_order);
    RUN_TEST(test_roundtrip);
    RUN_TEST(test_bad_values_named);
    RUN_TEST(test_train_options);
    RUN_TEST(test_inject_grammar);
    RUN_TEST(test_help_inject);
    RUN_TEST(test_holder_list_grammar);
    RUN_TEST(test_program_argv);
    RUN_TEST(test_lr_schedule);
    RUN_TEST(test_adamw_matches_reference);
    TEST_MAIN_END();
}
