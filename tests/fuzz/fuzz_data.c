/* fuzz_data.c — training data files (src/gpt2/data.c: data_open) from untrusted bytes.
 *
 * The input is the whole file: an llm.c token shard when it starts with magic 20240520,
 * else text. It is opened for a GPT-2 vocabulary (50257) and for a bytewise one (256); when
 * accepted, every token must lie inside the vocabulary and batches drawn from it (as every
 * rank draws them) must stay inside the data. */
#include "fuzz_util.h"

#include "data.h"

static void open_with(const char *path, int vocab, size_t size) {
    char err[1024] = "";
    DataSet *d = data_open(path, vocab, err, sizeof err);
    if (!d) {
        FUZZ_CHECK_ERR(err, path);
        return;
    }
    size_t n = data_num_tokens(d);
    FUZZ_CHECK(n >= 2 && n <= size, "accepted %zu tokens from %zu bytes", n, size);
    FUZZ_CHECK(data_describe(d)[0] != 0, "no description");
    enum { B = 3, TMAX = 16 };
    int T = n - 1 < TMAX ? (int)(n - 1) : TMAX;
    int inputs[B * TMAX], targets[B * TMAX];
    for (int64_t step = 0; step < 3; step++) {
        data_batch(d, 1337, step, (int)step, B, T, inputs, targets);
        for (int i = 0; i < B * T; i++)
            FUZZ_CHECK(inputs[i] >= 0 && inputs[i] < vocab && targets[i] >= 0 && targets[i] < vocab,
                       "token %d / %d outside vocabulary %d", inputs[i], targets[i], vocab);
    }
    data_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfd_file(data, size);
    open_with(path, 50257, size);
    open_with(path, 256, size);
    return 0;
}
