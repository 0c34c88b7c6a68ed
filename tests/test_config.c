/* test_config.c — option parsing, validation, and the serialisation workers read back. */
#include <string.h>

#include "config.h"
#include "harness.h"
#include "optimizer.h"

static void test_roundtrip(void) {
    JobConfig a, b;
    char err[512], text[65536];
    job_config_defaults(&a);
    CHECK(job_config_set(&a, "workers", "3", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "lr", "0.000123456789", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "seed", "18446744073709551615", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&a, "data", "/some where/x.txt", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_serialize(&a, text, sizeof text) == 0, "serialize");
    CHECK(job_config_parse_lines(&b, text, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "config differs after round trip");
}

static void test_bad_values_named(void) {
    JobConfig c;
    char err[512];
    job_config_defaults(&c);
    CHECK(job_config_set(&c, "steps", "abc", err, sizeof err) != 0 && strstr(err, "--steps") && strstr(err, "abc"), "%s", err);
    CHECK(job_config_set(&c, "workers", "0", err, sizeof err) != 0 && strstr(err, "--workers"), "%s", err);
    CHECK(job_config_set(&c, "seed", "-1", err, sizeof err) != 0 && strstr(err, "--seed"), "%s", err);
    CHECK(job_config_set(&c, "bogus", "1", err, sizeof err) != 0 && strstr(err, "--bogus"), "%s", err);
    CHECK(job_config_set(&c, "warmup", "50", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&c, "steps", "10", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) != 0 && strstr(err, "--warmup"), "%s", err);
    job_config_defaults(&c);
    CHECK(job_config_set(&c, "snapshot-every", "0", err, sizeof err) != 0 && strstr(err, "--snapshot-every"), "%s", err);
    CHECK(job_config_set(&c, "snapshot-every", "4", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_set(&c, "persist-every", "6", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) != 0 && strstr(err, "--persist-every") && strstr(err, "(4)") &&
              strstr(err, "found 6"),
          "%s", err);
    CHECK(job_config_set(&c, "persist-every", "8", err, sizeof err) == 0, "%s", err);
    CHECK(job_config_validate(&c, err, sizeof err) == 0, "%s", err);
}

static void test_lr_schedule(void) {
    AdamWConfig o = adamw_defaults();
    o.lr = 1.0f;
    o.warmup_steps = 10;
    o.total_steps = 110;
    o.final_lr_frac = 0.1f;
    CHECK(adamw_lr(&o, 0) == 0.1f, "%g", adamw_lr(&o, 0));
    CHECK(adamw_lr(&o, 9) == 1.0f, "%g", adamw_lr(&o, 9));
    CHECK(adamw_lr(&o, 10) == 1.0f, "%g", adamw_lr(&o, 10));
    float mid = adamw_lr(&o, 60);
    CHECK(mid > 0.54f && mid < 0.56f, "%g", mid);
    CHECK(adamw_lr(&o, 110) > 0.0999f && adamw_lr(&o, 110) < 0.1001f, "%g", adamw_lr(&o, 110));
}

static void test_adamw_matches_reference(void) {
    AdamWConfig o = adamw_defaults();
    o.beta1 = 0.9f; o.beta2 = 0.999f; o.eps = 1e-8f; o.weight_decay = 0.1f;
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m[2] = {0}, v[2] = {0};
    adamw_update(p, g, m, v, 2, &o, 0.01f, 1.0f, 1);
    /* first step: mhat = g, vhat = g^2, so the update is lr * (sign(g) + wd * p) */
    CHECK(p[0] > 1.0f - 0.01f * (1.0f + 0.1f) - 1e-6f && p[0] < 1.0f - 0.01f * (1.0f + 0.1f) + 1e-6f, "%.8f", p[0]);
    CHECK(p[1] > -2.0f + 0.01f * (1.0f + 0.2f) - 1e-6f && p[1] < -2.0f + 0.01f * (1.0f + 0.2f) + 1e-6f, "%.8f", p[1]);
    double n = grad_global_norm(g, 2);
    CHECK(n > 0.559016 && n < 0.559017, "%.7f", n);
    o.grad_clip = 0.5f;
    CHECK(grad_clip_scale(&o, 2.0) == 0.25f, "clip");
    CHECK(grad_clip_scale(&o, 0.3) == 1.0f, "no clip");
}

int main(void) {
    RUN_TEST(test_roundtrip);
    RUN_TEST(test_bad_values_named);
    RUN_TEST(test_lr_schedule);
    RUN_TEST(test_adamw_matches_reference);
    TEST_MAIN_END();
}
