/* modelfile.c — reads and writes llm.c model files, rejecting anything malformed. */
#include "modelfile.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "util.h"

static const char *const HEADER_FIELDS[8] = {"magic", "version", "max_seq_len", "vocab_size",
    "num_layers", "num_heads", "channels", "padded_vocab_size"};

static void header_to_config(const int32_t *h, GPT2Config *cfg) {
    cfg->max_seq_len = h[2];
    cfg->vocab_size = h[3];
    cfg->num_layers = h[4];
    cfg->num_heads = h[5];
    cfg->channels = h[6];
    cfg->padded_vocab_size = h[7];
}

static void config_to_header(const GPT2Config *cfg, int32_t *h) {
    memset(h, 0, 256 * sizeof *h);
    h[0] = MODELFILE_MAGIC;
    h[1] = MODELFILE_VERSION;
    h[2] = cfg->max_seq_len;
    h[3] = cfg->vocab_size;
    h[4] = cfg->num_layers;
    h[5] = cfg->num_heads;
    h[6] = cfg->channels;
    h[7] = cfg->padded_vocab_size;
}

static int read_header(FILE *f, const char *path, int32_t *h, char *err, size_t errlen) {
    size_t got = fread(h, sizeof(int32_t), 256, f);
    if (got != 256) {
        snprintf(err, errlen, "%s: model file header truncated: expected 1024 bytes, found %zu",
                 path, got * sizeof(int32_t));
        return -1;
    }
    if (h[0] != MODELFILE_MAGIC) {
        snprintf(err, errlen, "%s: model file field 'magic': expected %d, found %d (not an llm.c model file)",
                 path, MODELFILE_MAGIC, h[0]);
        return -1;
    }
    if (h[1] != MODELFILE_VERSION) {
        snprintf(err, errlen, "%s: model file field 'version': expected %d, found %d", path,
                 MODELFILE_VERSION, h[1]);
        return -1;
    }
    for (int i = 2; i < 8; i++) {
        if (h[i] <= 0) {
            snprintf(err, errlen, "%s: model file field '%s': expected > 0, found %d", path, HEADER_FIELDS[i], h[i]);
            return -1;
        }
    }
    GPT2Config cfg;
    header_to_config(h, &cfg);
    const char *bad = gpt2_config_check(&cfg);
    if (bad) {
        snprintf(err, errlen, "%s: model file header: %s", path, bad);
        return -1;
    }
    /* The header must agree with the file's size before anything is sized from it: a header
     * claiming max_seq_len 2^24 would otherwise allocate gigabytes for a 1 MB file. */
    struct stat st;
    uint64_t want = 1024 + (uint64_t)gpt2_num_params(&cfg) * sizeof(float);
    if (fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size != want) {
        snprintf(err, errlen, "%s: model file of %lld bytes, but its header (L=%d C=%d maxT=%d Vp=%d) implies %llu",
                 path, (long long)st.st_size, cfg.num_layers, cfg.channels, cfg.max_seq_len, cfg.padded_vocab_size,
                 (unsigned long long)want);
        return -1;
    }
    return 0;
}

int modelfile_read_config(const char *path, GPT2Config *cfg, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    int32_t h[256];
    int rc = read_header(f, path, h, err, errlen);
    fclose(f);
    if (rc == 0) header_to_config(h, cfg);
    return rc;
}

static int config_equal(const GPT2Config *a, const GPT2Config *b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels;
}

int modelfile_read(const char *path, const GPT2Config *cfg, float *params, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    int32_t h[256];
    int rc = -1;
    GPT2Config file_cfg;
    if (read_header(f, path, h, err, errlen) != 0) goto out;
    header_to_config(h, &file_cfg);
    if (!config_equal(&file_cfg, cfg)) {
        snprintf(err, errlen, "%s: model shape differs from the job's: file has L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, "
                 "job expects L=%d C=%d NH=%d V=%d Vp=%d maxT=%d", path, file_cfg.num_layers, file_cfg.channels,
                 file_cfg.num_heads, file_cfg.vocab_size, file_cfg.padded_vocab_size, file_cfg.max_seq_len,
                 cfg->num_layers, cfg->channels, cfg->num_heads, cfg->vocab_size, cfg->padded_vocab_size,
                 cfg->max_seq_len);
        goto out;
    }
    size_t n = gpt2_num_params(cfg);
    size_t got = fread(params, sizeof(float), n, f);
    if (got != n) {
        snprintf(err, errlen, "%s: model file truncated: expected %zu parameters (%zu bytes after the header), found %zu",
                 path, n, n * sizeof(float), got);
        goto out;
    }
    if (fgetc(f) != EOF) {
        snprintf(err, errlen, "%s: model file has trailing bytes after its %zu parameters", path, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(params[i])) {
            snprintf(err, errlen, "%s: parameter %zu is not finite (%g): corrupt model file", path, i, params[i]);
            goto out;
        }
    }
    rc = 0;
out:
    fclose(f);
    return rc;
}

int modelfile_write(const char *path, const GPT2Config *cfg, const float *params, char *err, size_t errlen) {
    int32_t h[256];
    config_to_header(cfg, h);
    struct iovec parts[2] = {{h, sizeof h}, {(void *)params, gpt2_num_params(cfg) * sizeof(float)}};
    return write_file_atomic(path, parts, 2, err, errlen);
}
