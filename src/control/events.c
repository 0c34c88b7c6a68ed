/* events.c — formats and pushes job events. */
#include "events.h"

#include <stdarg.h>
#include <stdio.h>

#include "util.h"

int event_emit(ctl_t *ctl, int64_t t0_wall_ms, const char *name, const char *fields_fmt, ...) {
    char fields[3072] = "";
    if (fields_fmt) {
        va_list ap;
        va_start(ap, fields_fmt);
        vsnprintf(fields, sizeof fields, fields_fmt, ap);
        va_end(ap);
    }
    char json[4096];
    snprintf(json, sizeof json, "{\"event\":\"%s\",\"t\":%.3f%s%s}", name,
             (double)(wall_ms() - t0_wall_ms) / 1e3, fields[0] ? "," : "", fields);
    return ctl_push_event(ctl, json);
}
