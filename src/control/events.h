/* events.h — job events (start, rank joined, failure, recovery, finish) as JSON lines.
 * Any process appends an event to the job's Redis list; the launcher drains the list into
 * DIR/events.jsonl, so events from every host end up in one file in arrival order. */
#ifndef DEADPOOL_EVENTS_H
#define DEADPOOL_EVENTS_H

#include <stdint.h>
#include "control.h"

/* Pushes {"event":name,"t":seconds since t0_wall_ms,<fields>}. fields_fmt formats the remaining
 * JSON members without braces (e.g. "\"rank\":%d"), or is NULL. 0 / -1. */
int event_emit(ctl_t *ctl, int64_t t0_wall_ms, const char *name, const char *fields_fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
