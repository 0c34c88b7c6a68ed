/* test_modelfile.c — llm.c model files: exact round trip, llm.c's layout, and clear errors for
 * every kind of malformed file. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "model.h"
#include "modelfile.h"

static char tmpdir[] = "/tmp/dp_test_modelfile_XXXXXX";
static char good[256];
static GPT2Config cfg;
static size_t nparams;

static void tmp_path(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", tmpdir, name); }

/* Copies the good file, then overwrites `len` bytes at `off` (or truncates/extends). */
static void variant(const char *path, long off, const void *bytes, size_t len, long new_size) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp %s %s", good, path);
    if (system(cmd) != 0) return;
    if (bytes) {
        FILE *f = fopen(path, "r+b");
        fseek(f, off, SEEK_SET);
        fwrite(bytes, 1, len, f);
        fclose(f);
    }
    if (new_size >= 0 && truncate(path, new_size) != 0) perror("truncate");
}

static void test_roundtrip_is_exact(void) {
    GPT2 *m = gpt2_create(&cfg, 1, 8, 0);
    gpt2_init_params(m, 7);
    char err[512];
    CHECK(modelfile_write(good, &cfg, gpt2_params(m), err, sizeof err) == 0, "%s", err);
    float *back = calloc(nparams, sizeof(float));
    CHECK(modelfile_read(good, &cfg, back, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(back, gpt2_params(m), nparams * sizeof(float)) == 0, "parameters differ after round trip");
    free(back);
    gpt2_free(m);
}

/* llm.c's gpt2_build_from_checkpoint: header ints 0..7, then exactly the params in its order. */
static void test_layout_is_llmc(void) {
    FILE *f = fopen(good, "rb");
    int32_t h[256];
    CHECK(fread(h, sizeof h, 1, f) == 1, "header");
    fclose(f);
    CHECK(h[0] == 20240326 && h[1] == 3, "magic/version %d %d", h[0], h[1]);
    CHECK(h[2] == cfg.max_seq_len && h[3] == cfg.vocab_size && h[4] == cfg.num_layers && h[5] == cfg.num_heads &&
              h[6] == cfg.channels && h[7] == cfg.padded_vocab_size, "header fields");
    size_t L = (size_t)h[4], C = (size_t)h[6], Vp = (size_t)h[7], maxT = (size_t)h[2];
    size_t llmc = Vp * C + maxT * C + L * C * 2 + L * 3 * C * C + L * 3 * C + L * C * C + L * C + L * C * 2 +
                  L * 4 * C * C + L * 4 * C + L * C * 4 * C + L * C + 2 * C;
    struct stat st;
    stat(good, &st);
    CHECK((size_t)st.st_size == 1024 + llmc * 4, "file size %lld, llm.c expects %zu", (long long)st.st_size, 1024 + llmc * 4);
}

static void expect_reject(const char *name, const char *must_contain, long off, const void *bytes, size_t len,
                          long new_size) {
    char path[256], err[1024];
    tmp_path(path, sizeof path, name);
    variant(path, off, bytes, len, new_size);
    float *buf = calloc(nparams, sizeof(float));
    int rc = modelfile_read(path, &cfg, buf, err, sizeof err);
    CHECK(rc != 0, "%s: accepted", name);
    CHECK(strstr(err, path) != NULL, "%s: error does not name the file: %s", name, err);
    CHECK(strstr(err, must_contain) != NULL, "%s: error '%s' lacks '%s'", name, err, must_contain);
    free(buf);
}

static void test_rejects_malformed(void) {
    int32_t v;
    v = 12345;
    expect_reject("magic.bin", "'magic'", 0, &v, 4, -1);
    v = 2;
    expect_reject("version.bin", "'version'", 4, &v, 4, -1);
    v = -4;
    expect_reject("channels.bin", "'channels'", 24, &v, 4, -1);
    v = 3; /* channels 64 not divisible by 3 heads */
    expect_reject("heads.bin", "num_heads", 20, &v, 4, -1);
    expect_reject("truncated.bin", "truncated", 0, NULL, 0, 1024 + 100);
    expect_reject("header.bin", "header truncated", 0, NULL, 0, 100);
    expect_reject("trailing.bin", "trailing", 0, NULL, 0, (long)(1024 + nparams * 4 + 4));
    float nan = NAN;
    expect_reject("nan.bin", "not finite", 1024 + 400, &nan, 4, -1);
    v = cfg.num_layers + 1;
    expect_reject("shape.bin", "shape", 16, &v, 4, (long)(1024 + nparams * 4));
}

static void test_read_config(void) {
    GPT2Config c;
    char err[512];
    CHECK(modelfile_read_config(good, &c, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&c, &cfg, sizeof c) == 0, "config differs");
    CHECK(modelfile_read_config("/nonexistent.bin", &c, err, sizeof err) != 0 && strstr(err, "/nonexistent.bin"), "%s", err);
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    tmp_path(good, sizeof good, "good.bin");
    gpt2_preset("tiny", &cfg);
    nparams = gpt2_num_params(&cfg);
    RUN_TEST(test_roundtrip_is_exact);
    RUN_TEST(test_layout_is_llmc);
    RUN_TEST(test_rejects_malformed);
    RUN_TEST(test_read_config);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    TEST_MAIN_END();
}
