/* report.c — `deadpool report DIR`: DIR/report.html, one self-contained page of the run.
 *
 * The logs are read with jansson, every line checked (a JSON object; the members the report
 * uses present and of the right type) so that a malformed line is an error naming its file and
 * line. The plots are inline SVG written here: the browser that shows the page draws them, the
 * page needs nothing else (no script, no network), and the SVG elements carry what they show
 * (class="failure" data-failure="K" on every mark of failure K), so a test can check a plot
 * from the file's text. */
#include "report.h"
#include "report_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <jansson.h>

#include "util.h"
static void *grow(void *p, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return p;
    size_t c = *cap ? *cap * 2 : 256;
    void *q = realloc(p, c * size);
    if (!q) return NULL;
    *cap = c;
    return q;
}

/* printf of a NaN or an infinity writes nan / inf, which JSON has no word for: a diverged loss
 * must not make the whole log unreadable, so outside strings those words become null. */
static char *nonfinite_to_null(const char *in, size_t len, size_t *outlen, int *changed) {
    char *out = malloc(len + len / 3 + 8);
    if (!out) return NULL;
    size_t o = 0;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        if (in_str) {
            out[o++] = c;
            if (c == '\\' && i + 1 < len) out[o++] = in[++i];
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') { in_str = 1; out[o++] = c; continue; }
        size_t j = i + (c == '-' || c == '+');
        size_t w = 0;
        if (len - j >= 3 && (!strncmp(in + j, "nan", 3) || !strncmp(in + j, "inf", 3))) w = 3;
        if (w && len - j >= 8 && !strncmp(in + j, "infinity", 8)) w = 8;
        char prev = o ? out[o - 1] : ':';
        char next = j + w < len ? in[j + w] : '}';
        if (w && strchr(":,[ \t", prev) && strchr(",}] \t\r\n", next)) {
            memcpy(out + o, "null", 4);
            o += 4;
            i = j + w - 1;
            *changed = 1;
            continue;
        }
        out[o++] = c;
    }
    out[o] = 0;
    *outlen = o;
    return out;
}

/* Member key of o as a number: 0 with *v, 1 absent or null (*v = NAN), -1 another type (err). */
static int get_num(json_t *o, const char *key, int required, double *v, const char *where, char *err, size_t errlen) {
    json_t *x = json_object_get(o, key);
    *v = NAN;
    if (!x || json_is_null(x)) {
        if (!required) return 1;
        snprintf(err, errlen, "%s: expected a number \"%s\", found %s", where, key, x ? "null" : "none");
        return -1;
    }
    if (!json_is_number(x)) {
        snprintf(err, errlen, "%s: \"%s\" must be a number", where, key);
        return -1;
    }
    *v = json_number_value(x);
    return 0;
}

static int get_str(json_t *o, const char *key, char *out, size_t len, const char *where, char *err, size_t errlen) {
    json_t *x = json_object_get(o, key);
    out[0] = 0;
    if (!x || json_is_null(x)) return 1;
    if (!json_is_string(x)) {
        snprintf(err, errlen, "%s: \"%s\" must be a string", where, key);
        return -1;
    }
    snprintf(out, len, "%s", json_string_value(x));
    return 0;
}

static int on_metric_line(Report *R, json_t *o, const char *where, char *err, size_t errlen) {
    MRow r;
    if (get_num(o, "step", 1, &r.step, where, err, errlen) < 0 || get_num(o, "t", 1, &r.t, where, err, errlen) < 0)
        return -1;
    if (r.step < 0 || r.step > 1e12 || r.step != floor(r.step)) {
        snprintf(err, errlen, "%s: \"step\" must be a whole number >= 0, found %g", where, r.step);
        return -1;
    }
    if (!isfinite(r.t)) {
        snprintf(err, errlen, "%s: \"t\" must be finite", where);
        return -1;
    }
    struct { const char *key; double *v; } opt[] = {
        {"loss", &r.loss}, {"lr", &r.lr}, {"grad_norm", &r.grad_norm}, {"step_ms", &r.step_ms},
        {"tokens_per_s", &r.tps}, {"epoch", &r.epoch}, {"committed_step", &r.committed},
        {"snapshot_wait_ms", &r.wait_ms},
    };
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (get_num(o, opt[i].key, 0, opt[i].v, where, err, errlen) < 0) return -1;
    if (r.t + 1e-3 < R->m_last_t) R->m_offset += R->m_last_t; /* a resumed job's first line */
    R->m_last_t = r.t;
    r.t += R->m_offset;
    if (!(R->m = grow(R->m, &R->cm, R->nm, sizeof *R->m))) { snprintf(err, errlen, "out of memory"); return -1; }
    R->m[R->nm++] = r;
    return 0;
}

static Incident *new_incident(Report *R) {
    if (!(R->inc = grow(R->inc, &R->cinc, R->ninc, sizeof *R->inc))) return NULL;
    Incident *x = &R->inc[R->ninc++];
    memset(x, 0, sizeof *x);
    x->spare = x->rollback_step = x->detect = x->decide = x->restore = x->rebuild = x->resnap = NAN;
    x->total = x->first_done = x->recomputed = x->t_resumed = x->step_hit = NAN;
    x->rank = -1;
    return x;
}

/* "key=value key=value" of every member but event and t, for the events table. */
static char *members_text(json_t *o) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    const char *key;
    json_t *v;
    int first = 1;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "event") || !strcmp(key, "t")) continue;
        fprintf(f, "%s%s=", first ? "" : " ", key);
        first = 0;
        if (json_is_string(v)) fputs(json_string_value(v), f);
        else {
            char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
            fputs(s ? s : "?", f);
            free(s);
        }
    }
    fclose(f);
    return buf;
}

/* --- one handler per event that feeds the report: (R, the line, its time, where) -> 0 / -1 + err */

static int on_start(Report *R, json_t *o, double t, const char *where, char *err, size_t errlen) {
    (void)t;
    if (R->starts > 1) return 0; /* a resumed job: the first start has the config */
    if (get_str(o, "job", R->job, sizeof R->job, where, err, errlen) < 0 ||
        get_str(o, "program", R->program, sizeof R->program, where, err, errlen) < 0 ||
        get_num(o, "workers", 0, &R->workers, where, err, errlen) < 0 ||
        get_num(o, "spares", 0, &R->spares, where, err, errlen) < 0 ||
        get_num(o, "steps", 0, &R->steps, where, err, errlen) < 0 ||
        get_num(o, "seed", 0, &R->seed, where, err, errlen) < 0)
        return -1;
    return 0;
}

/* "failure" or "restart" (restart: 1). */
static int on_failure(Report *R, json_t *o, double t, int restart, const char *where, char *err, size_t errlen) {
    /* A failure first seen as "no spare left" (its rank unknown then) gets its details now. */
    Incident *x = NULL;
    double v;
    for (size_t i = 0; i < R->ninc && !x; i++)
        if (R->inc[i].placeholder && !R->inc[i].recovered) x = &R->inc[i];
    if (!x && !(x = new_incident(R))) { snprintf(err, errlen, "out of memory"); return -1; }
    if (get_num(o, "rank", 0, &v, where, err, errlen) < 0 ||
        get_str(o, "kind", x->kind, sizeof x->kind, where, err, errlen) < 0)
        return -1;
    x->rank = isnan(v) ? -1 : (int)v;
    if (!x->placeholder) x->t_fail = t;
    x->placeholder = 0;
    x->restart_mode = restart;
    return 0;
}

/* "no_spare" or "job_failed" (failed: 1). */
static int on_not_acted(Report *R, json_t *o, double t, int failed, const char *where, char *err, size_t errlen) {
    /* The coordinator could not act on a failure (no spare, no fault tolerance): it has no
     * failure line of its own, so it counts from here, unless one is already open. */
    int open = 0;
    for (size_t i = 0; i < R->ninc; i++) open |= !R->inc[i].recovered;
    if (!open) {
        Incident *x = new_incident(R);
        if (!x) { snprintf(err, errlen, "out of memory"); return -1; }
        x->t_fail = t;
        x->placeholder = 1;
        if (R->fault_t >= 0 && t - R->fault_t < 120) { /* most likely the fault injected just before */
            x->rank = R->fault_rank;
            x->t_fail = R->fault_t;
        }
        snprintf(x->kind, sizeof x->kind, "%s", failed ? "job failed" : "no spare");
    }
    if (!failed) {
        R->no_spare++;
        return 0;
    }
    char s[1024];
    if (get_str(o, "message", s, sizeof s, where, err, errlen) < 0) return -1;
    snprintf(R->failed_msg, sizeof R->failed_msg, "%s", s);
    return 0;
}

static int on_recovered(Report *R, json_t *o, double t, const char *where, char *err, size_t errlen) {
    double rank;
    char kind[24], mode[24];
    if (get_num(o, "rank", 0, &rank, where, err, errlen) < 0 ||
        get_str(o, "failure_kind", kind, sizeof kind, where, err, errlen) < 0 ||
        get_str(o, "mode", mode, sizeof mode, where, err, errlen) < 0)
        return -1;
    int r = isnan(rank) ? -1 : (int)rank;
    /* The oldest failure of that rank not yet recovered, else one of its own (a rebuild
     * without a failed rank, or a log that lost its failure line). */
    Incident *x = NULL;
    for (size_t i = 0; i < R->ninc && !x; i++)
        if (!R->inc[i].recovered && R->inc[i].rank == r) x = &R->inc[i];
    if (!x) {
        if (!(x = new_incident(R))) { snprintf(err, errlen, "out of memory"); return -1; }
        x->rank = r;
        x->t_fail = t;
        snprintf(x->kind, sizeof x->kind, "%s", kind);
    }
    if (!x->kind[0]) snprintf(x->kind, sizeof x->kind, "%s", kind);
    x->recovered = 1;
    if (!strcmp(mode, "restart")) x->restart_mode = 1;
    struct { const char *key; double *v; } f[] = {
        {"spare", &x->spare}, {"rollback_step", &x->rollback_step}, {"detect_ms", &x->detect},
        {"decide_ms", &x->decide}, {"restore_ms", &x->restore}, {"rebuild_ms", &x->rebuild},
        {"resnapshot_ms", &x->resnap}, {"total_ms", &x->total}, {"first_step_done_ms", &x->first_done},
        {"steps_recomputed", &x->recomputed},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (get_num(o, f[i].key, 0, f[i].v, where, err, errlen) < 0) return -1;
    /* The event is stamped when the first step after the recovery is done: the failure
     * happened first_step_done_ms before it. */
    if (isfinite(x->first_done)) x->t_fail = t - x->first_done / 1e3;
    else if (isfinite(x->total)) x->t_fail = t - x->total / 1e3;
    x->t_resumed = isfinite(x->total) ? x->t_fail + x->total / 1e3 : t;
    return 0;
}

static int on_snapshot_stats(Report *R, json_t *o, double t, const char *where, char *err, size_t errlen) {
    (void)t;
    if (!(R->snap = grow(R->snap, &R->csnap, R->nsnap, sizeof *R->snap))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    SnapRow *x = &R->snap[R->nsnap];
    struct { const char *key; double *v; } f[] = {
        {"rank", &x->rank}, {"epoch", &x->epoch}, {"captures", &x->captures}, {"waits", &x->waits},
        {"wait_ms_total", &x->wait_total}, {"bytes_copied", &x->bytes_copied},
        {"bytes_replicated", &x->bytes_replicated}, {"copy_ms_mean", &x->copy_mean},
        {"replicate_ms_mean", &x->repl_mean}, {"cpu_ms", &x->cpu_ms}, {"holder_cpu_ms", &x->holder_cpu_ms},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (get_num(o, f[i].key, 0, f[i].v, where, err, errlen) < 0) return -1;
    R->nsnap++;
    return 0;
}

static int on_finish(Report *R, json_t *o, double t, const char *where, char *err, size_t errlen) {
    double v;
    R->have_finish = 1;
    R->finish_t = t;
    if (get_str(o, "status", R->status, sizeof R->status, where, err, errlen) < 0 ||
        get_num(o, "workers_cpu_s", 0, &v, where, err, errlen) < 0)
        return -1;
    R->cpu_s = isnan(v) ? R->cpu_s : (isnan(R->cpu_s) ? 0 : R->cpu_s) + v;
    return 0;
}

static int on_event_line(Report *R, json_t *o, const char *where, char *err, size_t errlen) {
    char name[40];
    double t;
    if (get_str(o, "event", name, sizeof name, where, err, errlen) < 0) return -1;
    if (!name[0]) { snprintf(err, errlen, "%s: expected a string \"event\", found none", where); return -1; }
    if (get_num(o, "t", 1, &t, where, err, errlen) < 0) return -1;
    if (!isfinite(t)) { snprintf(err, errlen, "%s: \"t\" must be finite", where); return -1; }
    if (!strcmp(name, "start") && R->starts++ > 0) R->e_offset += R->e_last_t;
    R->e_last_t = t;
    t += R->e_offset;
    if (!(R->e = grow(R->e, &R->ce, R->ne, sizeof *R->e))) { snprintf(err, errlen, "out of memory"); return -1; }
    ERow *row = &R->e[R->ne++];
    row->t = t;
    snprintf(row->name, sizeof row->name, "%s", name);
    row->text = members_text(o);

    if (!strcmp(name, "start")) return on_start(R, o, t, where, err, errlen);
    if (!strcmp(name, "failure") || !strcmp(name, "restart"))
        return on_failure(R, o, t, !strcmp(name, "restart"), where, err, errlen);
    if (!strcmp(name, "no_spare") || !strcmp(name, "job_failed"))
        return on_not_acted(R, o, t, !strcmp(name, "job_failed"), where, err, errlen);
    if (!strcmp(name, "recovered")) return on_recovered(R, o, t, where, err, errlen);
    if (!strcmp(name, "snapshot_stats")) return on_snapshot_stats(R, o, t, where, err, errlen);
    if (!strcmp(name, "finish")) return on_finish(R, o, t, where, err, errlen);
    if (!strcmp(name, "diverged")) {
        char s[1024];
        if (get_str(o, "message", s, sizeof s, where, err, errlen) < 0) return -1;
        snprintf(R->failed_msg, sizeof R->failed_msg, "%s", s);
    } else if (!strcmp(name, "fault_injected")) {
        double rank;
        if (get_num(o, "rank", 0, &rank, where, err, errlen) < 0) return -1;
        R->fault_rank = isnan(rank) ? -1 : (int)rank;
        R->fault_t = t;
    } else if (!strcmp(name, "spare_joined")) R->spare_joined++;
    else if (!strcmp(name, "spare_lost")) R->spare_lost++;
    else if (!strcmp(name, "fenced")) R->fenced++;
    return 0;
}

static int read_jsonl(Report *R, const char *name, line_fn fn, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", R->dir, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char where[4300];
        snprintf(where, sizeof where, "%s:%ld", path, lineno);
        size_t len = (size_t)n;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == len) continue; /* blank line */
        int changed = 0;
        size_t clen;
        char *clean = nonfinite_to_null(line, len, &clen, &changed);
        if (!clean) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
        R->nonfinite |= changed;
        json_error_t je;
        json_t *o = json_loadb(clean, clen, JSON_REJECT_DUPLICATES, &je);
        free(clean);
        if (!o) {
            snprintf(err, errlen, "%s: not valid JSON: %s (column %d)", where, je.text, je.column);
            rc = -1;
        } else if (!json_is_object(o)) {
            snprintf(err, errlen, "%s: expected a JSON object, found another value", where);
            rc = -1;
        } else {
            rc = fn(R, o, where, err, errlen);
        }
        json_decref(o);
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

/* --- numbers --------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of the finite values of one member (at byte offset off) of the metric rows. */
double rep_quantile(const Report *R, size_t off, double q) {
    double *s = malloc((R->nm ? R->nm : 1) * sizeof *s);
    size_t k = 0;
    for (size_t i = 0; s && i < R->nm; i++) {
        double x;
        memcpy(&x, (const char *)&R->m[i] + off, sizeof x);
        if (isfinite(x)) s[k++] = x;
    }
    double r = NAN;
    if (k) {
        qsort(s, k, sizeof *s, cmp_double);
        r = s[(size_t)floor(q * (double)(k - 1) + 0.5)];
    }
    free(s);
    return r;
}

double rep_nz(double v) { return isfinite(v) ? v : 0; }

static void report_free(Report *R) {
    for (size_t i = 0; i < R->ne; i++) free(R->e[i].text);
    free(R->e);
    free(R->m);
    free(R->inc);
    free(R->snap);
}

int report_write(const char *dir, const char *out_path, char *summary, size_t slen, char *err, size_t errlen) {
    Report R;
    memset(&R, 0, sizeof R);
    R.dir = dir;
    R.workers = R.spares = R.steps = R.seed = R.cpu_s = NAN;
    R.fault_rank = -1;
    R.fault_t = -1;
    int rc = -1;
    char *html = NULL;
    size_t hlen = 0;
    if (read_jsonl(&R, "events.jsonl", on_event_line, err, errlen) != 0 ||
        read_jsonl(&R, "metrics.jsonl", on_metric_line, err, errlen) != 0)
        goto out;
    rep_settle_incidents(&R);
    FILE *o = open_memstream(&html, &hlen);
    if (!o) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rep_page(o, &R);
    if (fclose(o) != 0 || !html) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    char path[4200];
    if (out_path) snprintf(path, sizeof path, "%s", out_path);
    else snprintf(path, sizeof path, "%s/report.html", dir);
    struct iovec part = {.iov_base = html, .iov_len = hlen};
    if (write_file_atomic(path, &part, 1, err, errlen) != 0) goto out;
    if (summary)
        snprintf(summary, slen, "%s: %zu steps, %zu failure%s, %zu events, %zu KiB", path, R.nm, R.ninc,
                 R.ninc == 1 ? "" : "s", R.ne, (hlen + 1023) / 1024);
    rc = 0;
out:
    free(html);
    report_free(&R);
    return rc;
}

int report_main(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: deadpool report DIR [--output FILE]\n"
                   "  writes DIR/report.html (or FILE): one self-contained page with the loss, step time, each\n"
                   "  recovery's phases and the snapshot cost, from DIR/metrics.jsonl and DIR/events.jsonl\n");
            return 0;
        }
        if (!strcmp(argv[i], "--output") && i + 1 < argc) out = argv[++i];
        else if (!strncmp(argv[i], "--output=", 9)) out = argv[i] + 9;
        else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "deadpool report: unexpected argument '%s' (usage: deadpool report DIR [--output FILE])\n", argv[i]);
            return 2;
        } else dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: deadpool report DIR [--output FILE]\n");
        return 2;
    }
    char err[8192], summary[4400];
    if (report_write(dir, out, summary, sizeof summary, err, sizeof err) != 0) {
        fprintf(stderr, "deadpool report: %s\n", err);
        return 1;
    }
    printf("report: %s\n", summary);
    return 0;
}
