/* worker.h — one DeadPool process: joins a job through Redis, takes a role (worker rank or
 * spare), heartbeats, and trains or waits. `deadpool run` starts these locally; `deadpool
 * worker` starts one on any host that reaches the job's Redis. */
#ifndef DEADPOOL_WORKER_H
#define DEADPOOL_WORKER_H

typedef struct {
    const char *redis_url;  /* password from the URL or DEADPOOL_REDIS_PASSWORD */
    const char *job;
    int spare;              /* join as a spare even if a rank is free */
    int rank;               /* claim this rank; -1 = first free rank */
    const char *bind_host;  /* address peers reach this process at */
} WorkerArgs;

/* Runs the process until the job ends. Exit status: 0 done, 1 bad job/config, 2 training
 * failed and no recovery decision came, 3 stopped by the job (Ctrl-C), 4 fenced (a newer
 * epoch replaced this process after it hung or lost its network). */
int worker_main(const WorkerArgs *args);

#endif
