/* test_report.c — `deadpool report` (src/tool/report.c, compiled in here) on synthetic logs:
 * every failure in every plot, malformed lines named by file and line, nan values, empty
 * logs; and the Prometheus exposition (metrics_http.h): its text, its counters, and one
 * request served over loopback. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "../src/tool/report.c"
#include "harness.h"
#include "metrics_http.h"

static char g_dir[256];

static void write_text(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The text of <svg id="ID" ...> up to its </svg>, in a static buffer ("" if none). */
static const char *svg_of(const char *html, const char *id) {
    static char buf[200000];
    char open[64];
    snprintf(open, sizeof open, "<svg id=\"%s\"", id);
    const char *a = strstr(html, open), *b = a ? strstr(a, "</svg>") : NULL;
    buf[0] = 0;
    if (a && b && (size_t)(b - a) < sizeof buf) snprintf(buf, sizeof buf, "%.*s", (int)(b - a), a);
    return buf;
}

static void test_nonfinite_words_become_null(void) {
    const char *in = "{\"loss\":nan,\"s\":\"nan inf\",\"y\":-inf,\"z\":[inf, -nan],\"w\":infinity,\"q\":\"a\\\"nan\"}";
    size_t n;
    int changed = 0;
    char *out = nonfinite_to_null(in, strlen(in), &n, &changed);
    CHECK(out && !strcmp(out, "{\"loss\":null,\"s\":\"nan inf\",\"y\":null,\"z\":[null, null],\"w\":null,\"q\":\"a\\\"nan\"}"),
          "got %s", out ? out : "NULL");
    CHECK(changed == 1, "changed %d", changed);
    free(out);
    const char *plain = "{\"name\":\"info\",\"v\":1.5}";
    changed = 0;
    out = nonfinite_to_null(plain, strlen(plain), &n, &changed);
    CHECK(out && !strcmp(out, plain) && !changed, "plain line changed: %s", out ? out : "NULL");
    free(out);
}

/* A job of 20 steps, 2 workers: rank 1 fails during step 6 (back to 5), rank 0 during step 15
 * (back to 13, one step recomputed). */
static void write_two_failure_logs(void) {
    char m[8192] = "", line[256];
    int epoch = 0;
    double t = 1.0;
    for (int s = 1; s <= 20; s++) {
        if (s == 6) { epoch = 1; t += 0.3; }
        if (s == 14 && epoch == 1) { /* steps 14 and 15 ran, then rank 0 failed: 14 again */
            snprintf(line, sizeof line, "{\"step\":14,\"loss\":3.0,\"step_ms\":50,\"tokens_per_s\":1000,\"epoch\":1,"
                                        "\"committed_step\":13,\"snapshot_wait_ms\":0.5,\"t\":%.3f}\n", t);
            strcat(m, line);
            t += 0.05;
            epoch = 2;
            t += 0.3;
        }
        snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%.3f,\"lr\":0.001,\"grad_norm\":1,\"step_ms\":50,"
                                    "\"tokens_per_s\":1000,\"epoch\":%d,\"committed_step\":%d,\"snapshot_wait_ms\":%s,\"t\":%.3f}\n",
                 s, 5.0 - s * 0.1, epoch, s - 1, s == 3 ? "2.5" : "0", t);
        strcat(m, line);
        t += 0.05;
    }
    write_text("metrics.jsonl", m);
    write_text("events.jsonl",
               "{\"event\":\"start\",\"t\":0.000,\"job\":\"feed1234\",\"workers\":2,\"spares\":2,\"program\":\"@gpt2 <b>x</b>\",\"steps\":20,\"seed\":7}\n"
               "{\"event\":\"spare_joined\",\"t\":0.1,\"proc\":1,\"pid\":100}\n"
               "{\"event\":\"failure\",\"t\":1.30,\"rank\":1,\"proc\":3,\"kind\":\"crash\",\"epoch\":0}\n"
               "{\"event\":\"decision\",\"t\":1.31,\"epoch\":1,\"rollback_step\":5,\"failed\":1}\n"
               "{\"event\":\"recovered\",\"t\":1.60,\"epoch\":1,\"rank\":1,\"spare\":1,\"failure_kind\":\"crash\",\"rollback_step\":5,"
               "\"detect_ms\":10,\"decide_ms\":15,\"restore_ms\":5.5,\"rebuild_ms\":40.2,\"resnapshot_ms\":8.1,\"total_ms\":100,"
               "\"first_step_done_ms\":350,\"steps_recomputed\":0}\n"
               "{\"event\":\"failure\",\"t\":2.10,\"rank\":0,\"proc\":4,\"kind\":\"hang\",\"epoch\":1}\n"
               "{\"event\":\"recovered\",\"t\":2.40,\"epoch\":2,\"rank\":0,\"spare\":2,\"failure_kind\":\"hang\",\"rollback_step\":13,"
               "\"detect_ms\":200,\"decide_ms\":15,\"restore_ms\":5,\"rebuild_ms\":40,\"resnapshot_ms\":8,\"total_ms\":300,"
               "\"first_step_done_ms\":350,\"steps_recomputed\":1}\n"
               "{\"event\":\"snapshot_stats\",\"t\":2.9,\"rank\":0,\"epoch\":2,\"captures\":7,\"commits\":7,\"failures\":0,\"waits\":1,"
               "\"wait_ms_total\":2.5,\"bytes_copied\":7168,\"bytes_replicated\":7168,\"copy_ms_mean\":0.1,\"replicate_ms_mean\":0.2,"
               "\"bytes_pulled\":0,\"cpu_ms\":1.4,\"holder_cpu_ms\":0.7,\"warmup_ms\":1,\"warmup_cpu_ms\":1}\n"
               "{\"event\":\"finish\",\"t\":3.0,\"status\":\"done\",\"steps\":20,\"workers_cpu_s\":4.5}\n");
}

static void test_report_two_failures_in_every_plot(void) {
    write_two_failure_logs();
    char err[8192] = "", summary[1024] = "", path[512];
    int rc = report_write(g_dir, NULL, summary, sizeof summary, err, sizeof err);
    CHECK(rc == 0, "report_write: %s", err);
    snprintf(path, sizeof path, "%s/report.html", g_dir);
    char *html = read_all(path);
    CHECK(html != NULL, "no report.html");
    if (!html) return;
    static const char *const plots[] = {"plot-loss", "plot-steptime", "plot-recovery", "plot-snapshot"};
    for (int p = 0; p < 4; p++) {
        const char *svg = svg_of(html, plots[p]);
        CHECK(svg[0], "%s missing", plots[p]);
        CHECK(strstr(svg, "class=\"failure\" data-failure=\"1\"") && strstr(svg, "class=\"failure\" data-failure=\"2\""),
              "%s lacks a failure", plots[p]);
        CHECK(!strstr(svg, "data-failure=\"3\""), "%s shows a third failure", plots[p]);
    }
    /* The step in progress when each failure hit, and where it rolled back to. */
    CHECK(strstr(html, "failure 1: rank 1 (crash) at 1.25 s, during step 6"), "failure 1's step or time wrong");
    CHECK(strstr(html, "failure 2: rank 0 (hang) at 2.05 s, during step 15"), "failure 2's step or time wrong");
    CHECK(strstr(html, "#2 back to 13"), "recovery 2's mark missing");
    /* Phases to scale, with the remainder as other: 300 - (200+15+5+40+8) = 32 ms. */
    CHECK(strstr(html, "#2 other (notify, join): 32.0 ms (from 268.0 to 300.0 ms)"), "phase timeline wrong");
    CHECK(strstr(html, "#1 first step: 250.0 ms"), "first step phase wrong");
    /* The job table: spares used, recomputed, time lost = 400 ms stalled + 1 x 50 ms. */
    CHECK(strstr(html, "<td>spares used</td><td>2</td>"), "spares used");
    CHECK(strstr(html, "<td>steps recomputed</td><td>1</td>"), "steps recomputed");
    CHECK(strstr(html, "<td>time lost to failures</td><td>0.45 s: 400 ms stalled"), "time lost");
    CHECK(strstr(html, "<td>1.0 KiB</td>"), "bytes per generation (7168 bytes in 7)");
    /* Text from the logs is escaped. */
    CHECK(strstr(html, "@gpt2 &lt;b&gt;x&lt;/b&gt;") && !strstr(html, "<b>x</b>"), "program not escaped");
    CHECK(strstr(summary, "21 steps, 2 failures"), "summary '%s'", summary);
    free(html);
}

static void test_report_names_the_malformed_line(void) {
    write_two_failure_logs();
    write_text("metrics.jsonl", "{\"step\":1,\"t\":0.1}\n\n{\"step\":2,\"t\":0.2}\n{\"step\":3,\"t\":\n");
    char err[8192] = "", want[600], path[512];
    snprintf(path, sizeof path, "%s/report.html", g_dir);
    unlink(path);
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == -1, "accepted a truncated line");
    snprintf(want, sizeof want, "%s/metrics.jsonl:4: not valid JSON", g_dir);
    CHECK(strstr(err, want), "err '%s'", err);
    CHECK(access(path, F_OK) != 0, "a report was written anyway");
    write_text("metrics.jsonl", "{\"step\":1,\"t\":0.1}\n");
    write_text("events.jsonl", "{\"event\":\"recovered\",\"t\":1,\"rank\":\"one\"}\n");
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == -1, "accepted a string rank");
    snprintf(want, sizeof want, "%s/events.jsonl:1: \"rank\" must be a number", g_dir);
    CHECK(strstr(err, want), "err '%s'", err);
    write_text("events.jsonl", "{\"event\":\"start\",\"t\":0}\n{\"event\":\"x\",\"t\":1e999}\n");
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == -1, "accepted an infinite t");
    CHECK(strstr(err, "events.jsonl:2:"), "err '%s'", err);
}

/* Hostile text in every string field of events.jsonl (and an unknown event) comes out as
 * text: no markup of its own reaches report.html. A string where metrics.jsonl has a number
 * is an error that names the field. */
static void test_report_escapes_hostile_text(void) {
#define H "<svg/onload='x'>\\\"&"
    write_text("metrics.jsonl", "{\"step\":1,\"loss\":2.5,\"step_ms\":50,\"t\":0.5}\n"
                                "{\"step\":2,\"loss\":2.4,\"step_ms\":50,\"t\":0.6}\n");
    write_text("events.jsonl",
               "{\"event\":\"start\",\"t\":0,\"job\":\"" H "\",\"workers\":2,\"spares\":1,\"program\":\"" H "\",\"steps\":2}\n"
               "{\"event\":\"failure\",\"t\":0.52,\"rank\":1,\"proc\":3,\"kind\":\"" H "\",\"epoch\":0}\n"
               "{\"event\":\"recovered\",\"t\":0.55,\"epoch\":1,\"rank\":1,\"spare\":2,\"failure_kind\":\"" H "\","
               "\"mode\":\"" H "\",\"rollback_step\":0,\"detect_ms\":1,\"total_ms\":20,\"first_step_done_ms\":30}\n"
               "{\"event\":\"" H "\",\"t\":0.56,\"message\":\"" H "\",\"" H "\":\"" H "\"}\n"
               "{\"event\":\"no_spare\",\"t\":0.57,\"message\":\"" H "\"}\n"
               "{\"event\":\"finish\",\"t\":0.7,\"status\":\"" H "\",\"message\":\"" H "\",\"steps\":2}\n");
#undef H
    char err[8192] = "", path[512];
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == 0, "report_write: %s", err);
    snprintf(path, sizeof path, "%s/report.html", g_dir);
    char *html = read_all(path);
    CHECK(html != NULL, "no report.html");
    if (!html) return;
    CHECK(!strstr(html, "<svg/onload") && !strstr(html, "'x'"), "hostile text reached the page as markup");
    CHECK(strstr(html, "&lt;svg/onload=&#39;x&#39;&gt;"), "the hostile text is not shown escaped");
    free(html);
    write_text("metrics.jsonl", "{\"step\":1,\"loss\":\"<svg/onload='x'>\",\"step_ms\":50,\"t\":0.5}\n");
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == -1 && strstr(err, "metrics.jsonl") && strstr(err, "\"loss\""),
          "a string loss: '%s'", err);
}

static void test_report_of_empty_logs(void) {
    write_text("metrics.jsonl", "");
    write_text("events.jsonl", "");
    char err[8192] = "", path[512];
    CHECK(report_write(g_dir, NULL, NULL, 0, err, sizeof err) == 0, "empty logs: %s", err);
    snprintf(path, sizeof path, "%s/report.html", g_dir);
    char *html = read_all(path);
    CHECK(html && strstr(html, "no failure in this run") && strstr(html, "</html>"), "empty report incomplete");
    free(html);
}

/* Every line of the exposition is a comment or "name{labels} value"; every sample's family
 * was declared with # TYPE before it. */
static void check_exposition(const char *text) {
    regex_t re;
    regcomp(&re, "^([a-z_]+)(\\{[a-z_]+=\"[a-z0-9_]*\"\\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$", REG_EXTENDED);
    char line[512], typed[4096] = " ";
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        p += n + (p[n] == '\n');
        if (!strncmp(line, "# TYPE ", 7)) {
            char name[128];
            if (sscanf(line + 7, "%127s", name) == 1 && strlen(typed) + strlen(name) + 2 < sizeof typed) {
                strcat(typed, name);
                strcat(typed, " ");
            }
            continue;
        }
        if (line[0] == '#') continue;
        regmatch_t mm[2];
        int bad = regexec(&re, line, 2, mm, 0) != 0;
        CHECK(!bad, "malformed sample line '%s'", line);
        if (bad) continue;
        char name[160];
        snprintf(name, sizeof name, " %.*s ", (int)(mm[1].rm_eo - mm[1].rm_so), line + mm[1].rm_so);
        CHECK(strstr(typed, name), "sample '%s' without # TYPE", line);
    }
    regfree(&re);
}

static void test_metrics_exposition(void) {
    LiveMetrics m;
    live_metrics_init(&m);
    char buf[16384];
    CHECK(metrics_format(&m, buf, sizeof buf) > 0, "format failed");
    check_exposition(buf);
    CHECK(!strstr(buf, "\ndeadpool_step "), "an unknown step is reported");
    CHECK(strstr(buf, "deadpool_recoveries_total{kind=\"crash\"} 0\n"), "zero counters missing");
    snprintf(m.job, sizeof m.job, "ab12");
    m.step = 12;
    m.loss = 3.25;
    m.step_ms = 41.5;
    m.tokens_per_s = 12345.6;
    m.epoch = 2;
    m.committed_step = 11;
    m.spares_available = 1;
    m.snapshot_wait_ms_total = 1500;
    m.snapshot_bytes_copied = 1e9;
    live_kind_add(m.recoveries, "crash");
    live_kind_add(m.recoveries, "crash");
    live_kind_add(m.recoveries, "Odd kind!");
    m.last_recovery_ms = 220;
    m.last_recovery_phase_ms[2] = 12.5;
    m.last_recovery_connections[0] = 15;
    m.last_recovery_connections[2] = 120;
    int n = metrics_format(&m, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n == strlen(buf), "length %d", n);
    check_exposition(buf);
    CHECK(strstr(buf, "\ndeadpool_step 12\n"), "step");
    CHECK(strstr(buf, "\ndeadpool_loss 3.25\n"), "loss");
    CHECK(strstr(buf, "\ndeadpool_step_duration_seconds 0.0415\n"), "step time");
    CHECK(strstr(buf, "\ndeadpool_tokens_per_second 12345.6\n"), "tokens/s");
    CHECK(strstr(buf, "\ndeadpool_committed_step 11\n"), "committed");
    CHECK(strstr(buf, "\ndeadpool_spares_available 1\n"), "spares");
    CHECK(strstr(buf, "\ndeadpool_snapshot_wait_seconds_total 1.5\n"), "wait total");
    CHECK(strstr(buf, "deadpool_snapshot_bytes_total{kind=\"copied\"} 1000000000\n"), "bytes");
    CHECK(strstr(buf, "deadpool_recoveries_total{kind=\"crash\"} 2\n"), "crash count");
    CHECK(strstr(buf, "deadpool_recoveries_total{kind=\"odd_kind_\"} 1\n"), "label value not cleaned");
    CHECK(strstr(buf, "deadpool_last_recovery_seconds 0.22\n"), "last recovery");
    CHECK(strstr(buf, "deadpool_last_recovery_phase_seconds{phase=\"restore\"} 0.0125\n"), "phase");
    CHECK(strstr(buf, "deadpool_job_info{job=\"ab12\"} 1\n"), "job info");
    CHECK(strstr(buf, "deadpool_last_recovery_connections{who=\"survivor_max\"} 15\n") &&
              strstr(buf, "deadpool_last_recovery_connections{who=\"total\"} 120\n") &&
              !strstr(buf, "who=\"replacement_max\""), "connections");
    CHECK(metrics_format(&m, buf, 100) == -1, "a short buffer is not an error");
    for (int i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        live_kind_add(m.failures, k);
    }
    CHECK(!strcmp(m.failures[LIVE_KINDS_MAX - 1].kind, "other"), "overflow kind '%s'", m.failures[LIVE_KINDS_MAX - 1].kind);
}

/* GET /metrics over a socket: status, content type, the published value; then 404 and 405. */
static void http_get(int port, const char *request, char *out, size_t len) {
    out[0] = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, request, strlen(request)) > 0) {
        size_t got = 0;
        ssize_t r;
        while (got + 1 < len && (r = read(fd, out + got, len - 1 - got)) > 0) got += (size_t)r;
        out[got] = 0;
    }
    if (fd >= 0) close(fd);
}

static void test_metrics_server_serves(void) {
    char err[512] = "", resp[20000];
    MetricsServer *s = metrics_server_start(NULL, 0, err, sizeof err);
    CHECK(s != NULL, "start: %s", err);
    if (!s) return;
    int port = metrics_server_port(s);
    CHECK(port > 0, "port %d", port);
    LiveMetrics m;
    live_metrics_init(&m);
    m.step = 7;
    metrics_server_publish(s, &m);
    http_get(port, "GET /metrics HTTP/1.0\r\n\r\n", resp, sizeof resp);
    CHECK(!strncmp(resp, "HTTP/1.1 200", 12) || !strncmp(resp, "HTTP/1.0 200", 12), "status: %.40s", resp);
    CHECK(strstr(resp, "text/plain; version=0.0.4"), "content type");
    CHECK(strstr(resp, "\ndeadpool_step 7\n"), "published value missing");
    http_get(port, "GET /nothing HTTP/1.0\r\n\r\n", resp, sizeof resp);
    CHECK(strstr(resp, " 404 "), "unknown path: %.40s", resp);
    http_get(port, "DELETE /metrics HTTP/1.0\r\n\r\n", resp, sizeof resp);
    CHECK(strstr(resp, " 405 "), "DELETE: %.40s", resp);
    CHECK(metrics_server_requests(s) == 3, "requests %lu", metrics_server_requests(s));
    /* The same port again: a clear error, not a second server. */
    MetricsServer *t = metrics_server_start("127.0.0.1", port, err, sizeof err);
    CHECK(t == NULL && strstr(err, "cannot listen"), "second server on port %d: %s", port, err);
    metrics_server_stop(t);
    metrics_server_stop(s);
    CHECK(metrics_server_start("no such host name.invalid", 0, err, sizeof err) == NULL, "bad host accepted");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dp_test_report_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN_TEST(test_nonfinite_words_become_null);
    RUN_TEST(test_report_two_failures_in_every_plot);
    RUN_TEST(test_report_names_the_malformed_line);
    RUN_TEST(test_report_escapes_hostile_text);
    RUN_TEST(test_report_of_empty_logs);
    RUN_TEST(test_metrics_exposition);
    RUN_TEST(test_metrics_server_serves);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) { /* a temporary directory left behind */ }
    TEST_MAIN_END();
}
