/* report_internal.h — what the report's two files share (not included outside src/tool):
 * the report's model of a run (read from its logs by report.c) and the numbers taken from it,
 * which report_html.c turns into the page. */
#ifndef DEADPOOL_REPORT_INTERNAL_H
#define DEADPOOL_REPORT_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

/* --- what the logs say ------------------------------------------------------------- */

typedef struct {
    double step, loss, lr, grad_norm, step_ms, tps, epoch, committed, wait_ms, t;
} MRow;
typedef struct {
    double t;
    char name[40];
    char *text; /* the other members, "key=value ..." */
} ERow;
/* One failure and what became of it. */
typedef struct {
    int k;              /* 1-based, in order of the failures */
    double t_fail;      /* job seconds when it happened (from the recovery's timeline when known) */
    int rank;
    char kind[24];
    int recovered;
    int restart_mode;   /* --ft disk: the whole job restarted from a checkpoint */
    int placeholder;    /* seen as no_spare / job_failed; rank and kind not known (yet) */
    double t_resumed;   /* training resumed (t_fail + total) */
    double step_hit;    /* the step in progress when it happened */
    double spare, rollback_step, detect, decide, restore, rebuild, resnap, total, first_done, recomputed;
} Incident;
typedef struct {
    double rank, epoch, captures, waits, wait_total, bytes_copied, bytes_replicated, copy_mean, repl_mean, cpu_ms,
        holder_cpu_ms;
} SnapRow;
typedef struct {
    const char *dir;
    MRow *m;
    size_t nm, cm;
    ERow *e;
    size_t ne, ce;
    Incident *inc;
    size_t ninc, cinc;
    SnapRow *snap;
    size_t nsnap, csnap;
    int starts;
    char job[64], program[1024];
    double workers, spares, steps, seed;
    int have_finish;
    char status[32], failed_msg[1024];
    double finish_t, cpu_s;
    int spare_joined, spare_lost, no_spare, fenced;
    double m_offset, m_last_t, e_offset, e_last_t; /* a resumed job's logs start its clock again */
    int nonfinite;                                  /* nan/inf values read as missing */
    int fault_rank;                                 /* the newest fault_injected: rank and time (-1: none) */
    double fault_t;
} Report;
typedef int (*line_fn)(Report *, json_t *, const char *, char *, size_t);
#define SVG_W 960.0
#define PAD_L 64.0
#define PAD_R 16.0
typedef struct {
    double x0, y0, w, h, xmin, xmax, ymin, ymax;
    const char *id;
} Frame;
#define LABEL_ROWS 4
#define LABEL_MAX 256
/* Where the marks' labels already are along the top of a plot, per row. */
typedef struct {
    int n[LABEL_ROWS];
    double lo[LABEL_ROWS][LABEL_MAX], hi[LABEL_ROWS][LABEL_MAX];
} Labels;
enum { PH_DETECT, PH_DECIDE, PH_RESTORE, PH_REBUILD, PH_RESNAP, PH_OTHER, PH_FIRST, PH_RESTART, PH_N };

double rep_quantile(const Report *R, size_t off, double q);
double rep_nz(double v);
void rep_phases(const Incident *x, double ph[PH_N]);
void rep_settle_incidents(Report *R);
void rep_page(FILE *o, Report *R);

#endif
