/* options.c — parsing, checking, (de)serialising and printing typed option tables. */
#include "options.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const OptSpec *opt_find(OptTable t, const char *name) {
    for (size_t i = 0; i < t.n; i++)
        if (strcmp(t.opts[i].name, name) == 0) return &t.opts[i];
    return NULL;
}

static int set_number(const OptSpec *o, void *field, const char *value, char *err, size_t errlen) {
    char *end = NULL;
    errno = 0;
    if (o->type == OPT_U64) {
        unsigned long long v = strtoull(value, &end, 10);
        if (errno || end == value || *end || value[0] == '-') goto bad;
        *(uint64_t *)field = v;
        return 0;
    }
    double v = o->type == OPT_INT ? (double)strtoll(value, &end, 10) : strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v) || v < o->min || v > o->max) goto bad;
    if (o->type == OPT_INT) *(int *)field = (int)v;
    else *(float *)field = (float)v;
    return 0;
bad:
    if (o->type == OPT_U64)
        snprintf(err, errlen, "--%s: expected a non-negative integer, found '%s'", o->name, value);
    else
        snprintf(err, errlen, "--%s: expected %s in [%g, %g], found '%s'", o->name,
                 o->type == OPT_INT ? "an integer" : "a finite number", o->min, o->max, value);
    return -1;
}

static int set_text(const OptSpec *o, char *field, const char *value, char *err, size_t errlen) {
    if (strchr(value, '\n')) { snprintf(err, errlen, "--%s: value contains a newline", o->name); return -1; }
    size_t have = o->type == OPT_LIST && field[0] && value[0] ? strlen(field) + 1 : 0;
    if (have + strlen(value) >= o->cap) {
        snprintf(err, errlen, "--%s: expected at most %zu characters in all, found %zu", o->name, o->cap - 1,
                 have + strlen(value));
        return -1;
    }
    if (have) snprintf(field + have - 1, o->cap - (have - 1), ",%s", value);
    else snprintf(field, o->cap, "%s", value);
    return 0;
}

int opt_set(OptTable t, void *base, const char *name, const char *value, char *err, size_t errlen) {
    const OptSpec *o = opt_find(t, name);
    if (!o) { snprintf(err, errlen, "unknown option --%s (see deadpool run --help)", name); return -1; }
    void *field = (char *)base + o->offset;
    if (o->type == OPT_STR || o->type == OPT_LIST) return set_text(o, field, value, err, errlen);
    if (o->type == OPT_ENUM) {
        char names[256] = "";
        for (int i = 0; o->choices[i]; i++) {
            if (!strcmp(o->choices[i], value)) { *(int *)field = i; return 0; }
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", o->choices[i]);
        }
        snprintf(err, errlen, "--%s: expected one of %s, found '%s'", o->name, names, value);
        return -1;
    }
    return set_number(o, field, value, err, errlen);
}

/* %.9g round-trips every float exactly. */
int opt_format(const OptSpec *o, const void *base, char *buf, size_t len) {
    const void *field = (const char *)base + o->offset;
    switch (o->type) {
    case OPT_INT: return snprintf(buf, len, "%d", *(const int *)field);
    case OPT_U64: return snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
    case OPT_FLOAT: return snprintf(buf, len, "%.9g", (double)*(const float *)field);
    case OPT_ENUM: return snprintf(buf, len, "%s", o->choices[*(const int *)field]);
    default: return snprintf(buf, len, "%s", (const char *)field);
    }
}

int opt_serialize(OptTable t, const void *base, char *buf, size_t len) {
    size_t used = 0;
    if (len) buf[0] = 0;
    for (size_t i = 0; i < t.n; i++) {
        char value[4200];
        opt_format(&t.opts[i], base, value, sizeof value);
        int n = snprintf(buf + used, len - used, "%s=%s\n", t.opts[i].name, value);
        if (n < 0 || (size_t)n >= len - used) return -1;
        used += (size_t)n;
    }
    return 0;
}

int opt_parse_lines(OptTable t, void *base, const char *text, int skip_unknown, char *err, size_t errlen) {
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char buf[4400];
        if (n >= sizeof buf) { snprintf(err, errlen, "job config: line of %zu characters, at most %zu", n, sizeof buf - 1); return -1; }
        memcpy(buf, line, n);
        buf[n] = 0;
        if (n > 0) {
            char *eq = strchr(buf, '=');
            if (!eq) { snprintf(err, errlen, "job config: expected name=value, found '%.200s'", buf); return -1; }
            *eq = 0;
            const OptSpec *o = opt_find(t, buf);
            if (o) {
                /* A list is stored joined: set it whole, not appended to the default. */
                if (o->type == OPT_LIST) ((char *)base + o->offset)[0] = 0;
                if (opt_set(t, base, buf, eq + 1, err, errlen) != 0) return -1;
            } else if (!skip_unknown) {
                snprintf(err, errlen, "job config: unknown option '%.100s'", buf);
                return -1;
            }
        }
        line += n + (nl ? 1 : 0);
    }
    return 0;
}

void opt_print_help(OptTable t, const void *base) {
    for (size_t i = 0; i < t.n; i++) {
        if (!strncmp(t.opts[i].help, "(internal)", 10)) continue;
        char def[4200];
        opt_format(&t.opts[i], base, def, sizeof def);
        printf("  --%-18s %s%s%s%s\n", t.opts[i].name, t.opts[i].help, def[0] ? " [" : "", def, def[0] ? "]" : "");
    }
}
