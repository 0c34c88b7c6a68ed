/* test_data.c — token shards, text, the built-in corpus and the deterministic batch sampler. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "harness.h"

static char tmpdir[] = "/tmp/dp_test_data_XXXXXX";

static void path_in_tmp(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", tmpdir, name); }

static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

static void test_shard_roundtrip(void) {
    char path[256], err[512];
    path_in_tmp(path, sizeof path, "ok.bin");
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++) toks[i] = (uint16_t)(i * 7 % 300);
    CHECK(data_write_shard(path, toks, 1000, err, sizeof err) == 0, "%s", err);
    DataSet *d = data_open(path, 300, err, sizeof err);
    CHECK(d != NULL, "%s", err);
    if (!d) return;
    CHECK(data_num_tokens(d) == 1000, "%zu", data_num_tokens(d));
    int in[2 * 8], tg[2 * 8];
    data_batch(d, 1, 0, 0, 2, 8, in, tg);
    for (int i = 0; i < 16; i++) {
        /* targets are inputs shifted by one inside each window of the known sequence */
        if (i % 8 != 7) CHECK(tg[i] == in[i + 1], "target %d", i);
    }
    data_free(d);
}

static void test_shard_rejects_bad_files(void) {
    char path[256], err[512];
    uint16_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (uint16_t)i;
    path_in_tmp(path, sizeof path, "trunc.bin");
    data_write_shard(path, toks, 100, err, sizeof err);
    CHECK(truncate(path, 1024 + 150) == 0, "truncate");
    DataSet *d = data_open(path, 256, err, sizeof err);
    CHECK(d == NULL && strstr(err, "truncated") && strstr(err, path), "err='%s'", err);
    data_free(d);

    path_in_tmp(path, sizeof path, "vocab.bin");
    data_write_shard(path, toks, 100, err, sizeof err);
    d = data_open(path, 50, err, sizeof err);
    CHECK(d == NULL && strstr(err, "vocab"), "err='%s'", err);
    data_free(d);

    path_in_tmp(path, sizeof path, "version.bin");
    int32_t header[256] = {20240520, 7, 100};
    write_bytes(path, header, sizeof header);
    d = data_open(path, 256, err, sizeof err);
    CHECK(d == NULL && strstr(err, "'version'") && strstr(err, "expected 1"), "err='%s'", err);
    data_free(d);

    d = data_open("/nonexistent/file.txt", 256, err, sizeof err);
    CHECK(d == NULL && strstr(err, "/nonexistent/file.txt"), "err='%s'", err);
    data_free(d);
}

static void test_text_is_bytewise(void) {
    char path[256], err[512];
    path_in_tmp(path, sizeof path, "t.txt");
    const char *text = "hello, world\n";
    write_bytes(path, text, strlen(text));
    DataSet *d = data_open(path, 256, err, sizeof err);
    CHECK(d && data_num_tokens(d) == strlen(text), "%s", err);
    if (!d) return;
    int in[4], tg[4];
    data_batch(d, 3, 5, 0, 1, 4, in, tg);
    int found = 0;
    for (size_t off = 0; off + 5 <= strlen(text); off++) {
        int match = 1;
        for (int t = 0; t < 4; t++) match &= in[t] == (unsigned char)text[off + t] && tg[t] == (unsigned char)text[off + t + 1];
        found |= match;
    }
    CHECK(found, "batch is not a window of the text");
    data_free(d);
}

static void test_batches_are_pure_functions(void) {
    DataSet *d = data_builtin(100000);
    CHECK(d && data_num_tokens(d) >= 100000, "builtin");
    if (!d) return;
    int a[4 * 32], b[4 * 32], ta[4 * 32], tb[4 * 32];
    data_batch(d, 42, 10, 3, 4, 32, a, ta);
    data_batch(d, 42, 10, 3, 4, 32, b, tb);
    CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(ta, tb, sizeof ta) == 0, "same args must give the same batch");
    data_batch(d, 42, 11, 3, 4, 32, b, tb);
    CHECK(memcmp(a, b, sizeof a) != 0, "another step must give another batch");
    data_batch(d, 42, 10, 4, 4, 32, b, tb);
    CHECK(memcmp(a, b, sizeof a) != 0, "another micro-batch must give another batch");
    data_batch(d, 43, 10, 3, 4, 32, b, tb);
    CHECK(memcmp(a, b, sizeof a) != 0, "another seed must give another batch");
    DataSet *d2 = data_builtin(100000);
    data_batch(d2, 42, 10, 3, 4, 32, b, tb);
    CHECK(memcmp(a, b, sizeof a) == 0, "built-in corpus must be identical across loads");
    data_free(d);
    data_free(d2);
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    RUN_TEST(test_shard_roundtrip);
    RUN_TEST(test_shard_rejects_bad_files);
    RUN_TEST(test_text_is_bytewise);
    RUN_TEST(test_batches_are_pure_functions);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    TEST_MAIN_END();
}
