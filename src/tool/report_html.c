/* report_html.c — report.html from a run's model (report.c reads the logs into it): the
 * HTML, the inline SVG plots (every mark of failure K carries class="failure"
 * data-failure="K", so a test can check a plot from the file's text), the page. */
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
/* --- HTML and SVG ---------------------------------------------------------------------- */

static void esc(FILE *o, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '"': fputs("&quot;", o); break;
        case '\'': fputs("&#39;", o); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\t') fputc(' ', o); /* XML has no word for them */
            else fputc(*s, o);
        }
    }
}

/* A number for a table cell: "–" when unknown. */
static void cell(FILE *o, const char *fmt, double v) {
    fputs("<td>", o);
    if (isfinite(v)) fprintf(o, fmt, v);
    else fputs("–", o);
    fputs("</td>", o);
}

static void bytes_text(char *out, size_t len, double b) {
    if (!isfinite(b)) snprintf(out, len, "–");
    else if (b >= 1 << 30) snprintf(out, len, "%.2f GiB", b / (1 << 30));
    else if (b >= 1 << 20) snprintf(out, len, "%.2f MiB", b / (1 << 20));
    else if (b >= 1 << 10) snprintf(out, len, "%.1f KiB", b / (1 << 10));
    else snprintf(out, len, "%.0f B", b);
}

static void duration_text(char *out, size_t len, double s) {
    if (!isfinite(s)) snprintf(out, len, "–");
    else if (s < 1) snprintf(out, len, "%.0f ms", s * 1e3);
    else if (s < 120) snprintf(out, len, "%.2f s", s);
    else if (s < 7200) snprintf(out, len, "%d min %02d s", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(out, len, "%d h %02d min", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static const char *const C_FAIL = "#d62728", *const C_RECOVER = "#2ca02c";

static double fx(const Frame *f, double x) { return f->x0 + (x - f->xmin) / (f->xmax - f->xmin) * f->w; }

static double fy(const Frame *f, double y) { return f->y0 + f->h - (y - f->ymin) / (f->ymax - f->ymin) * f->h; }

static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

/* Sets a range that holds [lo, hi], widened when empty. */
static void set_range(double *lo, double *hi, double a, double b) {
    if (!isfinite(a) || !isfinite(b)) { a = 0; b = 1; }
    if (b - a < 1e-12 * (fabs(a) + fabs(b)) || b <= a) {
        double d = fabs(a) > 0 ? fabs(a) * 0.1 : 1;
        a -= d;
        b += d;
    }
    *lo = a;
    *hi = b;
}

static void svg_open(FILE *o, const char *id, double h, const char *label) {
    fprintf(o, "<svg id=\"%s\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" "
               "width=\"%.0f\" height=\"%.0f\" role=\"img\" aria-label=\"", id, SVG_W, h, SVG_W, h);
    esc(o, label);
    fputs("\">\n", o);
}

/* Grid, ticks and axis titles of f; clip path "clip-ID" for what is drawn inside. */
static void axes(FILE *o, const Frame *f, const char *xlabel, const char *ylabel) {
    fprintf(o, "<defs><clipPath id=\"clip-%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath></defs>\n",
            f->id, f->x0, f->y0 - 1, f->w, f->h + 2);
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", f->x0, f->y0, f->w, f->h);
    fputs("<g class=\"axis\">\n", o);
    double sx = nice_step(f->xmax - f->xmin, 8), sy = nice_step(f->ymax - f->ymin, 5);
    for (double x = ceil(f->xmin / sx) * sx; x <= f->xmax + sx * 1e-9; x += sx) {
        double px = fx(f, x);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", px, f->y0, px, f->y0 + f->h);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.6g</text>\n", px, f->y0 + f->h + 14,
                fabs(x) < sx * 1e-9 ? 0.0 : x);
    }
    for (double y = ceil(f->ymin / sy) * sy; y <= f->ymax + sy * 1e-9; y += sy) {
        double py = fy(f, y);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", f->x0, py, f->x0 + f->w, py);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>\n", f->x0 - 5, py + 4,
                fabs(y) < sy * 1e-9 ? 0.0 : y);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"title\">", f->x0 + f->w / 2, f->y0 + f->h + 32);
    esc(o, xlabel);
    fprintf(o, "</text>\n<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\" class=\"title\">",
            f->y0 + f->h / 2);
    esc(o, ylabel);
    fputs("</text>\n</g>\n", o);
}

/* A line through the points (x[i], y[i]) in order; a non-finite y breaks it. Above two points
 * per pixel column, each column keeps its extremes (min and max, in order), so a long run
 * stays a small file and no spike is lost. */
static void polyline(FILE *o, const Frame *f, const double *x, const double *y, size_t n, const char *cls) {
    size_t limit = (size_t)(2 * f->w);
    int open = 0;
    double col_lo_px = NAN;
    size_t i = 0;
    while (i < n) {
        if (!isfinite(y[i]) || !isfinite(x[i])) {
            if (open) fputs("\"/>\n", o);
            open = 0;
            i++;
            continue;
        }
        if (!open) {
            fprintf(o, "<polyline class=\"%s\" clip-path=\"url(#clip-%s)\" points=\"", cls, f->id);
            open = 1;
        }
        if (n <= limit) {
            fprintf(o, "%.1f,%.1f ", fx(f, x[i]), fy(f, y[i]));
            i++;
            continue;
        }
        /* One pixel column: from i while the points stay in it and finite. */
        col_lo_px = floor(fx(f, x[i]));
        size_t j = i, lo = i, hi = i;
        while (j < n && isfinite(y[j]) && isfinite(x[j]) && floor(fx(f, x[j])) == col_lo_px) {
            if (y[j] < y[lo]) lo = j;
            if (y[j] > y[hi]) hi = j;
            j++;
        }
        size_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
        fprintf(o, "%.1f,%.1f ", fx(f, x[a]), fy(f, y[a]));
        if (b != a) fprintf(o, "%.1f,%.1f ", fx(f, x[b]), fy(f, y[b]));
        i = j;
    }
    if (open) fputs("\"/>\n", o);
}

/* A place for a label w pixels wide next to the line at px: the first row where it overlaps no
 * other label, on its side or else the other, inside the frame. 0 if there is none (many
 * failures close together: the mark keeps its line and its tooltip). */
static int label_place(Labels *lab, const Frame *f, double px, double w, int *side, int *row) {
    for (int r = 0; r < LABEL_ROWS; r++)
        for (int t = 0; t < 2; t++) {
            int s = t ? -*side : *side;
            double a = s > 0 ? px + 4 : px - 4 - w, b = a + w;
            if (a < f->x0 + 2 || b > f->x0 + f->w - 2 || lab->n[r] >= LABEL_MAX) continue;
            int clash = 0;
            for (int i = 0; i < lab->n[r] && !clash; i++) clash = a < lab->hi[r][i] + 6 && b > lab->lo[r][i] - 6;
            if (clash) continue;
            lab->lo[r][lab->n[r]] = a;
            lab->hi[r][lab->n[r]++] = b;
            *side = s;
            *row = r;
            return 1;
        }
    return 0;
}

/* A vertical mark at x for failure k (red, dashed) or its recovery (green), labelled at the
 * top on the given side (+1 right, -1 left) where there is room. Every mark of failure k
 * carries data-failure="k". */
static void vmark(FILE *o, const Frame *f, Labels *lab, double x, int k, int recovery, int side, const char *label,
                  const char *tip) {
    if (!isfinite(x)) x = f->xmax;
    if (x < f->xmin) x = f->xmin;
    if (x > f->xmax) x = f->xmax;
    double px = fx(f, x);
    int row = 0;
    fprintf(o, "<g class=\"%s\" data-failure=\"%d\"><title>", recovery ? "recovery" : "failure", k);
    esc(o, tip);
    fprintf(o, "</title><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"%s/>",
            px, f->y0, px, f->y0 + f->h, recovery ? C_RECOVER : C_FAIL, recovery ? "" : " stroke-dasharray=\"5 3\"");
    if (label_place(lab, f, px, 7.0 * (double)strlen(label), &side, &row)) {
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\" class=\"mark\">", px + 4 * side,
                f->y0 + 12 + row * 13, side > 0 ? "start" : "end", recovery ? C_RECOVER : C_FAIL);
        esc(o, label);
        fputs("</text>", o);
    }
    fputs("</g>\n", o);
}

/* "rank 3", or "rank ?" when the logs do not say which. */
static const char *rank_text(const Incident *x, char *buf, size_t len) {
    if (x->rank >= 0) snprintf(buf, len, "rank %d", x->rank);
    else snprintf(buf, len, "rank ?");
    return buf;
}

static void incident_tip(char *out, size_t len, const Incident *x) {
    char r[32];
    snprintf(out, len, "failure %d: %s (%s) at %.2f s, during step %.0f%s", x->k, rank_text(x, r, sizeof r),
             x->kind[0] ? x->kind : "?", x->t_fail, rep_nz(x->step_hit), x->recovered ? "" : "; not recovered");
}

static void recovery_tip(char *out, size_t len, const Incident *x) {
    char r[32];
    snprintf(out, len, "recovery %d: %s %s, rolled back to step %.0f, training resumed %.0f ms after the failure, "
                       "%.0f step(s) recomputed", x->k, rank_text(x, r, sizeof r), x->restart_mode ? "by a restart from disk" : "by a spare",
             rep_nz(x->rollback_step), rep_nz(x->total), rep_nz(x->recomputed));
}

static void legend(FILE *o, double x, double y, const char *const *names, const char *const *colors, int n) {
    for (int i = 0; i < n; i++) {
        fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>", x, y - 9, colors[i]);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"legend\">", x + 14, y);
        esc(o, names[i]);
        fputs("</text>\n", o);
        x += 22 + 7.0 * (double)strlen(names[i]);
    }
}

/* --- the plots --------------------------------------------------------------------------- */

/* Splits the metric rows into runs without a rollback (the step grows, the epoch stays), by
 * putting a NAN y between them. */
static void series(const Report *R, int by_time, double (*get)(const MRow *), double **xs, double **ys, size_t *n) {
    *xs = malloc((2 * R->nm + 1) * sizeof **xs);
    *ys = malloc((2 * R->nm + 1) * sizeof **ys);
    *n = 0;
    if (!*xs || !*ys) return;
    for (size_t i = 0; i < R->nm; i++) {
        const MRow *r = &R->m[i];
        if (i > 0 && (r->step <= R->m[i - 1].step || !(r->epoch == R->m[i - 1].epoch || (isnan(r->epoch) && isnan(R->m[i - 1].epoch))))) {
            (*xs)[*n] = NAN;
            (*ys)[(*n)++] = NAN;
        }
        (*xs)[*n] = by_time ? r->t : r->step;
        (*ys)[(*n)++] = get(r);
    }
}

static double m_loss(const MRow *r) { return r->loss; }

static double m_step_ms(const MRow *r) { return r->step_ms; }

static double m_wait(const MRow *r) { return r->wait_ms; }

static void step_markers(FILE *o, const Report *R, const Frame *f) {
    static Labels lab;
    memset(&lab, 0, sizeof lab);
    char label[96], tip[400];
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        char r[32];
        snprintf(label, sizeof label, "#%d %s %s", x->k, rank_text(x, r, sizeof r), x->kind);
        incident_tip(tip, sizeof tip, x);
        vmark(o, f, &lab, x->step_hit, x->k, 0, +1, label, tip);
        if (x->recovered) {
            snprintf(label, sizeof label, "#%d back to %.0f", x->k, rep_nz(x->rollback_step));
            recovery_tip(tip, sizeof tip, x);
            vmark(o, f, &lab, x->rollback_step, x->k, 1, -1, label, tip);
        }
    }
}

static double steps_axis_max(const Report *R) {
    double mx = isfinite(R->steps) ? R->steps : 1;
    for (size_t i = 0; i < R->nm; i++) mx = fmax(mx, R->m[i].step);
    return mx;
}

static void plot_loss(FILE *o, const Report *R) {
    double *xs, *ys;
    size_t n;
    series(R, 0, m_loss, &xs, &ys, &n);
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ys[i])) { lo = fmin(lo, ys[i]); hi = fmax(hi, ys[i]); }
    Frame f = {.x0 = PAD_L, .y0 = 10, .w = SVG_W - PAD_L - PAD_R, .h = 250, .id = "plot-loss"};
    set_range(&f.xmin, &f.xmax, 0, steps_axis_max(R));
    set_range(&f.ymin, &f.ymax, lo, hi);
    double pad = (f.ymax - f.ymin) * 0.05;
    f.ymin -= pad;
    f.ymax += pad * 3; /* room for the marks' labels */
    svg_open(o, f.id, 300, "training loss by step, failures and recoveries marked");
    axes(o, &f, "step", "loss");
    if (xs && ys) polyline(o, &f, xs, ys, n, "line-loss");
    step_markers(o, R, &f);
    fputs("</svg>\n", o);
    free(xs);
    free(ys);
}

static void plot_step_time(FILE *o, const Report *R) {
    double *xs, *ys;
    size_t n;
    series(R, 1, m_step_ms, &xs, &ys, &n);
    double tmax = 0, p95 = rep_quantile(R, offsetof(MRow, step_ms), 0.95), mx = 0;
    for (size_t i = 0; i < R->nm; i++) {
        tmax = fmax(tmax, R->m[i].t);
        if (isfinite(R->m[i].step_ms)) mx = fmax(mx, R->m[i].step_ms);
    }
    for (size_t i = 0; i < R->ninc; i++) tmax = fmax(tmax, rep_nz(R->inc[i].t_resumed));
    if (R->have_finish) tmax = fmax(tmax, R->finish_t);
    /* A warm-up outlier would flatten the rest: the axis stops at 4x the 95th percentile. */
    double ytop = isfinite(p95) && mx > 4 * p95 ? 4 * p95 : mx;
    size_t clipped = 0;
    for (size_t i = 0; i < R->nm; i++) clipped += R->m[i].step_ms > ytop;
    Frame f = {.x0 = PAD_L, .y0 = 10, .w = SVG_W - PAD_L - PAD_R, .h = 220, .id = "plot-steptime"};
    set_range(&f.xmin, &f.xmax, 0, tmax > 0 ? tmax : 1);
    set_range(&f.ymin, &f.ymax, 0, ytop > 0 ? ytop * 1.25 : 1);
    svg_open(o, f.id, 270, "step time over the job's time, failures and recoveries marked");
    axes(o, &f, clipped ? "job time (s) — steps above the axis are cut off" : "job time (s)", "step time (ms)");
    /* The stall of each recovery: from the failure until training resumed. */
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        double end = x->recovered && isfinite(x->t_resumed) ? x->t_resumed : f.xmax;
        fprintf(o, "<rect class=\"stall\" data-failure=\"%d\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", x->k,
                fx(&f, x->t_fail), f.y0, fmax(1.0, fx(&f, end) - fx(&f, x->t_fail)), f.h);
    }
    if (xs && ys) polyline(o, &f, xs, ys, n, "line-steptime");
    char label[96], tip[400];
    static Labels lab;
    memset(&lab, 0, sizeof lab);
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        char r[32];
        snprintf(label, sizeof label, "#%d %s %s", x->k, rank_text(x, r, sizeof r), x->kind);
        incident_tip(tip, sizeof tip, x);
        vmark(o, &f, &lab, x->t_fail, x->k, 0, -1, label, tip);
        if (x->recovered) {
            snprintf(label, sizeof label, "#%d resumed +%.0f ms", x->k, rep_nz(x->total));
            recovery_tip(tip, sizeof tip, x);
            vmark(o, &f, &lab, x->t_resumed, x->k, 1, +1, label, tip);
        }
    }
    fputs("</svg>\n", o);
    free(xs);
    free(ys);
}

static const char *const PH_NAMES[PH_N] = {"detect", "decide", "restore", "rebuild", "re-snapshot",
                                           "other (notify, join)", "first step", "restart from disk"};

static const char *const PH_COLORS[PH_N] = {"#e15759", "#f28e2b", "#4e79a7", "#76b7b2", "#59a14f",
                                            "#bab0ac", "#edc948", "#b07aa1"};

/* The phases of a recovery in order, ms each (0 = none). */
void rep_phases(const Incident *x, double ph[PH_N]) {
    memset(ph, 0, sizeof(double) * PH_N);
    if (!x->recovered) return;
    if (x->restart_mode) {
        ph[PH_RESTART] = rep_nz(x->total);
    } else {
        ph[PH_DETECT] = rep_nz(x->detect);
        ph[PH_DECIDE] = rep_nz(x->decide);
        ph[PH_RESTORE] = rep_nz(x->restore);
        ph[PH_REBUILD] = rep_nz(x->rebuild);
        ph[PH_RESNAP] = rep_nz(x->resnap);
        double sum = ph[PH_DETECT] + ph[PH_DECIDE] + ph[PH_RESTORE] + ph[PH_REBUILD] + ph[PH_RESNAP];
        if (rep_nz(x->total) > sum) ph[PH_OTHER] = rep_nz(x->total) - sum;
    }
    if (isfinite(x->first_done) && isfinite(x->total) && x->first_done > x->total) ph[PH_FIRST] = x->first_done - x->total;
}

static void plot_recovery(FILE *o, const Report *R) {
    double xmax = 0, ph[PH_N];
    for (size_t i = 0; i < R->ninc; i++) {
        rep_phases(&R->inc[i], ph);
        double s = 0;
        for (int p = 0; p < PH_N; p++) s += ph[p];
        xmax = fmax(xmax, s);
    }
    double row = 30, top = 30;
    double h = top + row * (double)(R->ninc ? R->ninc : 1) + 44;
    Frame f = {.x0 = 150, .y0 = top, .w = SVG_W - 150 - PAD_R, .h = row * (double)(R->ninc ? R->ninc : 1), .id = "plot-recovery"};
    set_range(&f.xmin, &f.xmax, 0, xmax > 0 ? xmax * 1.25 : 1); /* room for the note after each bar */
    f.ymin = 0;
    f.ymax = 1;
    svg_open(o, f.id, h, "each recovery's phases, stacked, to scale");
    legend(o, 8, 14, PH_NAMES, PH_COLORS, PH_N);
    fprintf(o, "<defs><clipPath id=\"clip-%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath></defs>\n",
            f.id, f.x0, f.y0, f.w, f.h);
    double sx = nice_step(f.xmax - f.xmin, 8);
    fputs("<g class=\"axis\">", o);
    for (double x = 0; x <= f.xmax + sx * 1e-9; x += sx) {
        double px = fx(&f, x);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", px, f.y0, px, f.y0 + f.h);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.6g</text>\n", px, f.y0 + f.h + 14, x);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"title\">ms after the failure</text></g>\n",
            f.x0 + f.w / 2, f.y0 + f.h + 32);
    if (!R->ninc)
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"note\">no failure in this run</text>\n", f.x0 + 8, f.y0 + 19);
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        double y = f.y0 + row * (double)i + 5, bh = row - 10;
        fprintf(o, "<g class=\"failure\" data-failure=\"%d\">", x->k);
        char r[32];
        fprintf(o, "<text x=\"8\" y=\"%.1f\" class=\"rowlabel\">#%d %s ", y + bh / 2 + 4, x->k, rank_text(x, r, sizeof r));
        esc(o, x->kind); /* from events.jsonl: text, never markup */
        fputs("</text>\n", o);
        if (!x->recovered) {
            fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">not recovered</text>", f.x0 + 4, y + bh / 2 + 4, C_FAIL);
            fputs("</g>\n", o);
            continue;
        }
        rep_phases(x, ph);
        double at = 0;
        for (int p = 0; p < PH_N; p++) {
            if (ph[p] <= 0) continue;
            double x1 = fx(&f, at), x2 = fx(&f, at + ph[p]);
            fprintf(o, "<rect class=\"phase\" data-phase=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                       "fill=\"%s\" clip-path=\"url(#clip-%s)\"><title>#%d %s: %.1f ms (from %.1f to %.1f ms)</title></rect>",
                    PH_NAMES[p], x1, y, fmax(x2 - x1, 0.5), bh, PH_COLORS[p], f.id, x->k, PH_NAMES[p], ph[p], at, at + ph[p]);
            at += ph[p];
        }
        if (isfinite(x->total)) { /* training resumed here */
            double px = fx(&f, x->total);
            fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>", px, y - 3,
                    px, y + bh + 3, C_RECOVER);
        }
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"note\">%.0f ms to resume</text>", fx(&f, at) + 6,
                y + bh / 2 + 4, rep_nz(x->total));
        fputs("</g>\n", o);
    }
    fputs("</svg>\n", o);
}

static void plot_snapshot(FILE *o, const Report *R) {
    double *xs, *ys;
    size_t n;
    series(R, 0, m_wait, &xs, &ys, &n);
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ys[i])) mx = fmax(mx, ys[i]);
    Frame f = {.x0 = PAD_L, .y0 = 10, .w = SVG_W - PAD_L - PAD_R, .h = 200, .id = "plot-snapshot"};
    set_range(&f.xmin, &f.xmax, 0, steps_axis_max(R));
    set_range(&f.ymin, &f.ymax, 0, mx > 0 ? mx * 1.35 : 1);
    svg_open(o, f.id, 250, "snapshot cost per generation: time each step waited for the previous snapshot");
    axes(o, &f, "step (one snapshot generation each)", "wait for snapshot (ms)");
    /* One bar per step: its wait for the previous generation's snapshot. */
    double bw = fmax(1.0, f.w / (f.xmax - f.xmin) * 0.7);
    fprintf(o, "<g class=\"bars-snapshot\" clip-path=\"url(#clip-%s)\">", f.id);
    size_t every = n > (size_t)(2 * f.w) ? n / (size_t)(2 * f.w) + 1 : 1;
    for (size_t i = 0; i < n; i += every) {
        double y = ys[i];
        for (size_t j = i + 1; j < i + every && j < n; j++)
            if (isfinite(ys[j]) && (!isfinite(y) || ys[j] > y)) y = ys[j]; /* the worst of the group */
        if (!isfinite(y) || !isfinite(xs[i]) || y <= 0) continue;
        fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>", fx(&f, xs[i]) - bw / 2, fy(&f, y), bw,
                f.y0 + f.h - fy(&f, y));
    }
    fputs("</g>\n", o);
    if (mx <= 0)
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"note\">no step waited for a snapshot</text>\n", f.x0 + 8,
                f.y0 + f.h - 8);
    step_markers(o, R, &f);
    fputs("</svg>\n", o);
    free(xs);
    free(ys);
}

/* --- the page ------------------------------------------------------------------------------ */

static const char CSS[] =
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:24px auto;"
    "max-width:1000px;color:#222;padding:0 12px}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd}"
    ".sub{color:#666;margin:0 0 12px}.bad{color:#d62728;font-weight:600}.good{color:#2ca02c;font-weight:600}"
    "table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}"
    "th{background:#f6f6f6}td:first-child,th:first-child{text-align:left}table.kv td:first-child{color:#555}"
    "table.kv td{text-align:left}svg.plot{width:100%;height:auto;max-width:960px;display:block}"
    "svg text{font:11px 'DejaVu Sans',sans-serif;fill:#333}svg .title{font-size:12px}svg .mark{font-size:11px;font-weight:600}"
    "svg .legend{font-size:11px}svg .note{fill:#666}svg .rowlabel{font-size:12px}"
    ".frame{fill:none;stroke:#bbb}.grid{stroke:#eee}.line-loss{fill:none;stroke:#1f77b4;stroke-width:1.5}"
    ".line-steptime{fill:none;stroke:#ff7f0e;stroke-width:1.2}.stall{fill:#d62728;fill-opacity:.12}"
    ".bars-snapshot rect{fill:#4e79a7}td.ev{text-align:left;font-family:monospace;font-size:12px;word-break:break-all}"
    "p.note{color:#555;font-size:13px}";

static int cmp_incident(const void *a, const void *b) {
    const Incident *x = a, *y = b;
    return (x->t_fail > y->t_fail) - (x->t_fail < y->t_fail);
}

/* Fills in what the incidents need from the metrics: their order, numbers and steps. */
void rep_settle_incidents(Report *R) {
    qsort(R->inc, R->ninc, sizeof *R->inc, cmp_incident);
    for (size_t i = 0; i < R->ninc; i++) {
        Incident *x = &R->inc[i];
        x->k = (int)i + 1;
        /* The step in progress: one past the newest step done before the failure. */
        double done = 0;
        for (size_t j = 0; j < R->nm && R->m[j].t <= x->t_fail; j++) done = R->m[j].step;
        x->step_hit = done + 1;
    }
}

static void kv_row(FILE *o, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void kv_row(FILE *o, const char *key, const char *fmt, ...) {
    char v[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    fputs("<tr><td>", o);
    esc(o, key);
    fputs("</td><td>", o);
    esc(o, v);
    fputs("</td></tr>\n", o);
}

/* The job's summary table, with what failures cost. */
static void job_section(FILE *o, Report *R) {
    size_t nm = R->nm;
    double med_ms = rep_quantile(R, offsetof(MRow, step_ms), 0.5), med_tps = rep_quantile(R, offsetof(MRow, tps), 0.5);
    double stall_ms = 0, recomputed = 0, last_step = 0, wait_total = 0;
    int recovered = 0, spares_used = 0, restarts = 0, unrecovered = 0;
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        if (!x->recovered) { unrecovered++; continue; }
        recovered++;
        stall_ms += rep_nz(x->total);
        recomputed += rep_nz(x->recomputed);
        if (x->restart_mode) restarts++;
        else if (isfinite(x->spare) && x->spare >= 0) spares_used++;
    }
    for (size_t i = 0; i < nm; i++) {
        last_step = fmax(last_step, R->m[i].step);
        wait_total += rep_nz(R->m[i].wait_ms);
    }
    double recompute_ms = recomputed * rep_nz(med_ms), lost_s = (stall_ms + recompute_ms) / 1e3;
    double wall = R->have_finish ? R->finish_t : (nm ? R->m[nm - 1].t : NAN);

    char a[64], b[64];
    fputs("<h2 id=\"job\">The job</h2>\n<table class=\"kv\" id=\"job-table\">\n", o);
    kv_row(o, "program", "%s", R->program[0] ? R->program : "–");
    kv_row(o, "world", "%.0f workers, %.0f spares at the start (%d spares joined in all, %d lost)", rep_nz(R->workers),
           rep_nz(R->spares), R->spare_joined, R->spare_lost);
    kv_row(o, "steps", "%.0f of %.0f done, seed %.0f%s", last_step, rep_nz(R->steps), rep_nz(R->seed),
           R->starts > 1 ? " (resumed from a checkpoint)" : "");
    duration_text(a, sizeof a, wall);
    kv_row(o, "wall time", "%s%s", a, isfinite(R->cpu_s) && R->cpu_s > 0 ? "" : "");
    if (isfinite(R->cpu_s) && R->cpu_s > 0) kv_row(o, "CPU time of the workers", "%.1f s", R->cpu_s);
    kv_row(o, "step time (median)", isfinite(med_ms) ? "%.1f ms" : "–", med_ms);
    kv_row(o, "throughput (median)", isfinite(med_tps) ? "%.0f tokens/s" : "–", med_tps);
    if (nm) kv_row(o, "final loss", "%.4f", R->m[nm - 1].loss);
    kv_row(o, "failures", "%zu (%d recovered%s%s)", R->ninc, recovered, R->no_spare ? ", no spare left at some point" : "",
           R->fenced ? ", stale processes fenced" : "");
    kv_row(o, "spares used", "%d%s", spares_used, restarts ? " (and whole-job restarts from disk)" : "");
    kv_row(o, "steps recomputed", "%.0f", recomputed);
    duration_text(a, sizeof a, stall_ms / 1e3);
    duration_text(b, sizeof b, recompute_ms / 1e3);
    kv_row(o, "time lost to failures", "%.2f s: %s stalled until training resumed + %s recomputing steps "
           "(steps recomputed × median step time)%s", lost_s, a, b,
           unrecovered ? "; and a failure that was not recovered stopped the job" : "");
    if (isfinite(wall) && wall > 0) kv_row(o, "share of the wall time lost", "%.1f %%", 100.0 * lost_s / wall);
    duration_text(a, sizeof a, wait_total / 1e3);
    kv_row(o, "steps waiting for snapshots", "%s in all", a);
    fputs("</table>\n", o);
    if (R->nonfinite)
        fputs("<p class=\"note\">Some values in the logs were not finite (nan or inf); they are left out of the plots.</p>\n", o);

}

/* One row per failure, with its recovery's phases. */
static void failures_table(FILE *o, const Report *R) {
    fputs("<table id=\"failures\">\n<tr><th>#</th><th>at (s)</th><th>rank</th><th>kind</th><th>step</th><th>spare</th>"
          "<th>rolled back to</th><th>detect</th><th>decide</th><th>restore</th><th>rebuild</th><th>re-snapshot</th>"
          "<th>resumed after (ms)</th><th>first step done (ms)</th><th>recomputed</th></tr>\n",
          o);
    for (size_t i = 0; i < R->ninc; i++) {
        const Incident *x = &R->inc[i];
        fprintf(o, "<tr data-failure=\"%d\"><td>%d</td>", x->k, x->k);
        cell(o, "%.2f", x->t_fail);
        if (x->rank >= 0) fprintf(o, "<td>%d</td><td>", x->rank);
        else fputs("<td>?</td><td>", o);
        esc(o, x->kind);
        fputs("</td>", o);
        cell(o, "%.0f", x->step_hit);
        if (x->restart_mode) fputs("<td>restart</td>", o);
        else cell(o, "%.0f", x->spare);
        cell(o, "%.0f", x->rollback_step);
        cell(o, "%.0f", x->detect);
        cell(o, "%.0f", x->decide);
        cell(o, "%.1f", x->restore);
        cell(o, "%.1f", x->rebuild);
        cell(o, "%.1f", x->resnap);
        if (!x->recovered) fputs("<td class=\"bad\">not recovered</td>", o);
        else cell(o, "%.0f", x->total);
        cell(o, "%.0f", x->first_done);
        cell(o, "%.0f", x->recomputed);
        fputs("</tr>\n", o);
    }
    fputs("</table>\n", o);

}

/* One row per rank and epoch: what its snapshots cost. */
static void snapshot_table(FILE *o, const Report *R) {
    char a[64];
    fputs("<table id=\"snapshot-table\">\n<tr><th>rank</th><th>epoch</th><th>generations</th><th>bytes per generation</th>"
          "<th>copy (ms per gen.)</th><th>replicate (ms per gen.)</th><th>CPU (ms per gen.)</th><th>holder CPU (ms per gen.)</th>"
          "<th>steps that waited</th><th>wait in all (ms)</th></tr>\n",
          o);
    for (size_t i = 0; i < R->nsnap; i++) {
        const SnapRow *s = &R->snap[i];
        double g = s->captures > 0 ? s->captures : NAN;
        fputs("<tr>", o);
        cell(o, "%.0f", s->rank);
        cell(o, "%.0f", s->epoch);
        cell(o, "%.0f", s->captures);
        bytes_text(a, sizeof a, s->bytes_copied / g);
        fprintf(o, "<td>%s</td>", a);
        cell(o, "%.3f", s->copy_mean);
        cell(o, "%.3f", s->repl_mean);
        cell(o, "%.3f", s->cpu_ms / g);
        cell(o, "%.3f", s->holder_cpu_ms / g);
        cell(o, "%.0f", s->waits);
        cell(o, "%.1f", s->wait_total);
        fputs("</tr>\n", o);
    }
    if (!R->nsnap) fputs("<tr><td colspan=\"10\">no process reported snapshot statistics</td></tr>\n", o);
    fputs("</table>\n", o);

}

static void events_section(FILE *o, const Report *R) {
    fprintf(o, "<h2 id=\"events\">Events</h2>\n<details><summary>%zu events</summary>\n<table id=\"events-table\">\n"
               "<tr><th>t (s)</th><th>event</th><th>details</th></tr>\n", R->ne);
    size_t shown = R->ne < 5000 ? R->ne : 5000;
    for (size_t i = 0; i < shown; i++) {
        fprintf(o, "<tr><td>%.3f</td><td>", R->e[i].t);
        esc(o, R->e[i].name);
        fputs("</td><td class=\"ev\">", o);
        esc(o, R->e[i].text ? R->e[i].text : "");
        fputs("</td></tr>\n", o);
    }
    if (shown < R->ne) fprintf(o, "<tr><td colspan=\"3\">… %zu more in events.jsonl</td></tr>\n", R->ne - shown);
    fputs("</table>\n</details>\n<p class=\"note\">Written by <code>deadpool report</code> from metrics.jsonl and "
          "events.jsonl; a self-contained page (no script, nothing fetched).</p>\n</body>\n</html>\n",
          o);
}

void rep_page(FILE *o, Report *R) {
    int recovered = 0;
    for (size_t i = 0; i < R->ninc; i++) recovered += R->inc[i].recovered;
    fputs("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n<title>DeadPool report",
          o);
    if (R->job[0]) { fputs(" — job ", o); esc(o, R->job); }
    fprintf(o, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>DeadPool run report</h1>\n<p class=\"sub\">", CSS);
    esc(o, R->dir);
    if (R->job[0]) { fputs(" · job ", o); esc(o, R->job); }
    const char *status = R->have_finish ? R->status : "unfinished (no finish event)";
    fprintf(o, " · <span class=\"%s\">", R->have_finish && !strcmp(R->status, "done") ? "good" : "bad");
    esc(o, status);
    fprintf(o, "</span> · %zu failure%s, %d recovered</p>\n", R->ninc, R->ninc == 1 ? "" : "s", recovered);
    if (R->failed_msg[0]) {
        fputs("<p class=\"bad\">", o);
        esc(o, R->failed_msg);
        fputs("</p>\n", o);
    }

    job_section(o, R);
    fputs("<h2 id=\"loss\">Loss</h2>\n", o);
    plot_loss(o, R);
    fputs("<p class=\"note\">Red dashed: a failure, at the step in progress when it hit; green: where its recovery "
          "rolled back to (training went on from the next step, recomputing the steps in between).</p>\n", o);
    fputs("<h2 id=\"steptime\">Step time</h2>\n", o);
    plot_step_time(o, R);
    fputs("<p class=\"note\">Shaded: from a failure until training resumed.</p>\n", o);

    fputs("<h2 id=\"recoveries\">Recoveries</h2>\n", o);
    plot_recovery(o, R);
    fputs("<p class=\"note\">Each phase as the slowest rank took it; <i>other</i> is the rest of the time until "
          "training resumed (the decision reaching the processes, joining the new epoch); the green line is when "
          "training resumed, the first step after it is drawn on.</p>\n",
          o);
    failures_table(o, R);

    fputs("<h2 id=\"snapshots\">Snapshot cost</h2>\n", o);
    plot_snapshot(o, R);
    fputs("<p class=\"note\">Each step's wait for the previous generation's snapshot (copy and replication normally "
          "overlap the next forward/backward, so this is the cost the step paid). Per rank and epoch, as each "
          "process reported when it left:</p>\n",
          o);
    snapshot_table(o, R);
    events_section(o, R);
}
