/* fuzz_modelfile.c — llm.c model files (src/gpt2/modelfile.c) from untrusted bytes.
 *
 * The input is the whole file. modelfile_read_config must accept it or say why, naming the
 * file; when it accepts, the caller may allocate gpt2_num_params floats for modelfile_read
 * (as the trainer does), so an accepted header must describe a file of exactly that size:
 * a header may never make its reader allocate more than the file backs. The file is also
 * read against a fixed small shape, the way a job reads `--model` against its own shape. */
#include "fuzz_util.h"

#include <math.h>

#include "model.h"
#include "modelfile.h"

/* The fixed shape: a model of 544 parameters (the seed corpus holds files of it). */
static const GPT2Config SMALL = {.max_seq_len = 4, .vocab_size = 5, .padded_vocab_size = 8,
                                 .num_layers = 2, .num_heads = 2, .channels = 4};

static void read_as(const char *path, const GPT2Config *cfg, size_t file_size) {
    size_t n = gpt2_num_params(cfg);
    float *params = malloc(n * sizeof *params);
    FUZZ_CHECK(params != NULL, "out of memory for %zu parameters", n);
    char err[1024] = "";
    if (modelfile_read(path, cfg, params, err, sizeof err) == 0) {
        FUZZ_CHECK(file_size == 1024 + n * sizeof(float), "accepted a %zu-byte file for %zu parameters", file_size, n);
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(isfinite(params[i]), "accepted a non-finite parameter %zu", i);
    } else {
        FUZZ_CHECK_ERR(err, path);
    }
    free(params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfd_file(data, size);
    char err[1024] = "";
    GPT2Config cfg;
    if (modelfile_read_config(path, &cfg, err, sizeof err) == 0) {
        FUZZ_CHECK(gpt2_config_check(&cfg) == NULL, "accepted an inconsistent config: %s", gpt2_config_check(&cfg));
        FUZZ_CHECK(size == 1024 + gpt2_num_params(&cfg) * sizeof(float),
                   "header accepted for %zu parameters (%zu bytes) in a %zu-byte file", gpt2_num_params(&cfg),
                   1024 + gpt2_num_params(&cfg) * sizeof(float), size);
        read_as(path, &cfg, size);
    } else {
        FUZZ_CHECK_ERR(err, path);
    }
    read_as(path, &SMALL, size);
    return 0;
}
