/* launcher.h — `deadpool run`: starts (or joins) the job's Redis, publishes the job config,
 * starts the local worker and spare processes, turns their events and metrics into progress
 * output and DIR/{events,metrics}.jsonl, and tears everything down (no orphans) at the end
 * or on Ctrl-C. */
#ifndef DEADPOOL_LAUNCHER_H
#define DEADPOOL_LAUNCHER_H

#include "config.h"

/* Runs the job to completion. Returns the process exit status: 0 success, 1 failure,
 * 130 stopped by SIGINT/SIGTERM. */
int launcher_run(const JobConfig *cfg);

#endif
