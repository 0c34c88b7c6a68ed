/* report.h — `deadpool report DIR`: one self-contained DIR/report.html from the job's
 * DIR/metrics.jsonl and DIR/events.jsonl (loss with failures and recoveries marked, step time,
 * each recovery's phases to scale, snapshot cost per generation, a table of the job). */
#ifndef DEADPOOL_REPORT_H
#define DEADPOOL_REPORT_H

#include <stddef.h>

/* Reads DIR's logs and writes the page to out_path (NULL: DIR/report.html). 0, or -1 with err
 * naming the file and line of anything malformed ("DIR/events.jsonl:12: ..."). A summary line
 * goes into summary (may be NULL). */
int report_write(const char *dir, const char *out_path, char *summary, size_t slen, char *err, size_t errlen);

/* The `deadpool report` command: argv after "report". An exit status. */
int report_main(int argc, char **argv);

#endif
