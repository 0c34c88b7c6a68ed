/* worker.c — process lifecycle: registration, role, heartbeat thread, spare wait, training. */
#include "worker.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "config.h"
#include "control.h"
#include "events.h"
#include "trainer.h"
#include "util.h"

typedef struct {
    redis_addr addr;
    const char *job;
    JobConfig cfg;
    int64_t t0_wall_ms;
    long proc_id;
    ctl_t *ctl;
    /* heartbeat thread */
    pthread_t hb_thread;
    atomic_int hb_stop;
    atomic_int job_over; /* the launcher set the job's state to stopping/done/failed */
} Proc;

static void *heartbeat_loop(void *arg) {
    Proc *p = arg;
    char err[256];
    ctl_t *c = ctl_connect(&p->addr, p->job, 2000, err, sizeof err);
    if (!c) { log_msg("heartbeat: %s", err); return NULL; }
    int period = p->cfg.heartbeat_ttl_ms / 3;
    while (!atomic_load(&p->hb_stop)) {
        if (ctl_heartbeat(c, p->proc_id, p->cfg.heartbeat_ttl_ms) != 0)
            log_msg("heartbeat failed: %s", ctl_last_error(c));
        char state[32];
        if (ctl_state_get(c, state, sizeof state) == 0 && strcmp(state, "running") != 0)
            atomic_store(&p->job_over, 1);
        sleep_ms(period > 0 ? period : 1);
    }
    ctl_close(c);
    return NULL;
}

static int read_job(Proc *p, char *err, size_t errlen) {
    static char text[65536];
    if (ctl_config_get(p->ctl, "config", text, sizeof text) != 0) {
        snprintf(err, errlen, "job '%s' not found in redis (no config): %s", p->job, ctl_last_error(p->ctl));
        return -1;
    }
    if (job_config_parse_lines(&p->cfg, text, err, errlen) != 0) return -1;
    char t0[32];
    if (ctl_config_get(p->ctl, "t0_ms", t0, sizeof t0) != 0) { snprintf(err, errlen, "job has no start time"); return -1; }
    p->t0_wall_ms = strtoll(t0, NULL, 10);
    return 0;
}

/* Claims the requested rank, or the first free one. Returns the rank, -1 if none is free. */
static int claim_rank(Proc *p, int wanted) {
    if (wanted >= 0) return ctl_claim_rank(p->ctl, wanted, p->proc_id) == 1 ? wanted : -1;
    for (int r = 0; r < p->cfg.workers; r++)
        if (ctl_claim_rank(p->ctl, r, p->proc_id) == 1) return r;
    return -1;
}

static int run_spare(Proc *p) {
    log_set_role("spare");
    if (ctl_spare_add(p->ctl, p->proc_id) != 0) { log_msg("cannot join the spare pool: %s", ctl_last_error(p->ctl)); return 1; }
    event_emit(p->ctl, p->t0_wall_ms, "spare_joined", "\"proc\":%ld,\"pid\":%d", p->proc_id, (int)getpid());
    while (!atomic_load(&p->job_over)) sleep_ms(20);
    ctl_spare_remove(p->ctl, p->proc_id);
    return 0;
}

static void push_metrics(Proc *p, const StepStats *s, long epoch) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"epoch\":%ld,\"t\":%.3f}",
             s->step + 1, s->loss, s->lr, s->grad_norm, s->step_ms, s->tokens_per_s, epoch,
             (double)(wall_ms() - p->t0_wall_ms) / 1e3);
    ctl_push_metric(p->ctl, json);
}

static int save_final_model(Proc *p, Trainer *t) {
    char path[1200], err[1024], esc[2048];
    snprintf(path, sizeof path, "%s/model.bin", p->cfg.out);
    if (trainer_save_model(t, path, err, sizeof err) != 0) {
        json_escape(err, esc, sizeof esc);
        event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":0,\"message\":\"%s\"", esc);
        log_msg("%s", err);
        return 1;
    }
    json_escape(path, esc, sizeof esc);
    event_emit(p->ctl, p->t0_wall_ms, "model_saved", "\"path\":\"%s\"", esc);
    return 0;
}

static int run_worker(Proc *p, int rank, const char *bind_host) {
    char role[32], err[1024], esc[2048];
    snprintf(role, sizeof role, "rank %d", rank);
    log_set_role(role);
    Trainer *t = trainer_create(&p->cfg, rank, p->cfg.workers, err, sizeof err);
    if (!t) {
        log_msg("%s", err);
        json_escape(err, esc, sizeof esc);
        event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", rank, esc);
        return 1;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    event_emit(p->ctl, p->t0_wall_ms, "rank_joined", "\"rank\":%d,\"proc\":%ld,\"pid\":%d,\"host\":\"%s\"",
               rank, p->proc_id, (int)getpid(), host);

    long epoch = ctl_epoch(p->ctl);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "dp:%s:e%ld:gloo", p->job, epoch);
    comm_store_addr store = {p->addr.host, p->addr.port, p->addr.password[0] ? p->addr.password : NULL};
    comm_t *comm = comm_create(&store, prefix, rank, p->cfg.workers, bind_host, p->cfg.start_timeout_ms,
                               err, sizeof err);
    if (!comm) {
        log_msg("joining the communicator failed: %s", err);
        json_escape(err, esc, sizeof esc);
        event_emit(p->ctl, p->t0_wall_ms, "error", "\"rank\":%d,\"message\":\"%s\"", rank, esc);
        trainer_free(t);
        return 2;
    }
    int rc = 0;
    for (int step = 0; step < p->cfg.steps; step++) {
        if (atomic_load(&p->job_over)) { rc = 3; break; }
        StepStats s;
        comm_status st = trainer_step(t, comm, step, &s);
        if (st != COMM_OK) {
            log_msg("step %d: %s: %s", step + 1, comm_status_str(st), comm_last_error(comm));
            json_escape(comm_last_error(comm), esc, sizeof esc);
            event_emit(p->ctl, p->t0_wall_ms, "comm_failure", "\"rank\":%d,\"step\":%d,\"error\":\"%s\",\"message\":\"%s\"",
                       rank, step + 1, comm_status_str(st), esc);
            rc = 2;
            break;
        }
        if (rank == 0) push_metrics(p, &s, epoch);
    }
    if (rc == 0 && rank == 0) rc = save_final_model(p, t);
    comm_destroy(comm);
    trainer_free(t);
    return rc;
}

int worker_main(const WorkerArgs *a) {
    signal(SIGPIPE, SIG_IGN);
    Proc p;
    memset(&p, 0, sizeof p);
    p.job = a->job;
    char err[1024];
    if (redis_addr_parse(a->redis_url, &p.addr, err, sizeof err) != 0) { log_msg("%s", err); return 1; }
    p.ctl = ctl_connect(&p.addr, a->job, 5000, err, sizeof err);
    if (!p.ctl) { log_msg("%s", err); return 1; }
    if (read_job(&p, err, sizeof err) != 0) { log_msg("%s", err); ctl_close(p.ctl); return 1; }
    p.proc_id = ctl_new_proc_id(p.ctl);
    if (p.proc_id < 0) { log_msg("registration failed: %s", ctl_last_error(p.ctl)); ctl_close(p.ctl); return 1; }
    ctl_heartbeat(p.ctl, p.proc_id, p.cfg.heartbeat_ttl_ms);
    pthread_create(&p.hb_thread, NULL, heartbeat_loop, &p);

    int rank = a->spare ? -1 : claim_rank(&p, a->rank);
    if (!a->spare && a->rank >= 0 && rank < 0) log_msg("rank %d is taken; joining as a spare", a->rank);
    int rc = rank >= 0 ? run_worker(&p, rank, a->bind_host) : run_spare(&p);

    atomic_store(&p.hb_stop, 1);
    pthread_join(p.hb_thread, NULL);
    ctl_close(p.ctl);
    return rc;
}
