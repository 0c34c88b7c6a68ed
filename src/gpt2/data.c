/* data.c — loads token shards and text into memory and serves deterministic batches. */
#include "data.h"
#include "rng.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct DataSet {
    uint16_t *tokens;
    size_t n;
    char desc[512];
};

static DataSet *dataset_new(size_t n) {
    DataSet *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->tokens = malloc(n * sizeof *d->tokens);
    if (!d->tokens) { free(d); return NULL; }
    d->n = n;
    return d;
}

void data_free(DataSet *d) {
    if (!d) return;
    free(d->tokens);
    free(d);
}

size_t data_num_tokens(const DataSet *d) { return d->n; }
const char *data_describe(const DataSet *d) { return d->desc; }

static unsigned char *read_whole_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    unsigned char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return NULL;
    }
    buf = malloc(size ? (size_t)size : 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        snprintf(err, errlen, "%s: read failed", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)size;
    return buf;
}

static DataSet *parse_shard(const char *path, const unsigned char *buf, size_t len, int vocab_size,
                            char *err, size_t errlen) {
    int32_t header[256];
    if (len < sizeof header) {
        snprintf(err, errlen, "%s: token shard header truncated: expected 1024 bytes, found %zu", path, len);
        return NULL;
    }
    memcpy(header, buf, sizeof header);
    if (header[1] != DATA_SHARD_VERSION) {
        snprintf(err, errlen, "%s: token shard field 'version': expected %d, found %d", path,
                 DATA_SHARD_VERSION, header[1]);
        return NULL;
    }
    if (header[2] <= 0) {
        snprintf(err, errlen, "%s: token shard field 'num_tokens': expected > 0, found %d", path, header[2]);
        return NULL;
    }
    size_t n = (size_t)header[2];
    size_t expected = sizeof header + n * sizeof(uint16_t);
    if (len != expected) {
        snprintf(err, errlen, "%s: token shard size: header says %zu tokens (%zu bytes), file has %zu bytes%s",
                 path, n, expected, len, len < expected ? " (truncated)" : "");
        return NULL;
    }
    DataSet *d = dataset_new(n);
    if (!d) { snprintf(err, errlen, "%s: out of memory", path); return NULL; }
    memcpy(d->tokens, buf + sizeof header, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        if (d->tokens[i] >= vocab_size) {
            snprintf(err, errlen, "%s: token %zu is %u, outside the model's vocabulary (vocab_size %d)",
                     path, i, d->tokens[i], vocab_size);
            data_free(d);
            return NULL;
        }
    }
    snprintf(d->desc, sizeof d->desc, "token shard '%s' (%zu tokens)", path, n);
    return d;
}

static DataSet *parse_text(const char *path, const unsigned char *buf, size_t len, int vocab_size,
                           char *err, size_t errlen) {
    DataSet *d = dataset_new(len ? len : 1);
    if (!d) { snprintf(err, errlen, "%s: out of memory", path); return NULL; }
    d->n = len;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] >= vocab_size) {
            snprintf(err, errlen, "%s: byte %zu is %u, outside the model's vocabulary (vocab_size %d); "
                     "text files are tokenised bytewise and need vocab_size >= 256", path, i, buf[i], vocab_size);
            data_free(d);
            return NULL;
        }
        d->tokens[i] = buf[i];
    }
    snprintf(d->desc, sizeof d->desc, "text '%s' (%zu bytes, bytewise tokens)", path, len);
    return d;
}

DataSet *data_open(const char *path, int vocab_size, char *err, size_t errlen) {
    size_t len = 0;
    unsigned char *buf = read_whole_file(path, &len, err, errlen);
    if (!buf) return NULL;
    int32_t magic = 0;
    if (len >= sizeof magic) memcpy(&magic, buf, sizeof magic);
    DataSet *d = magic == DATA_SHARD_MAGIC ? parse_shard(path, buf, len, vocab_size, err, errlen)
                                            : parse_text(path, buf, len, vocab_size, err, errlen);
    free(buf);
    if (d && d->n < 2) {
        snprintf(err, errlen, "%s: only %zu tokens, need at least 2", path, d->n);
        data_free(d);
        return NULL;
    }
    return d;
}

/* The built-in corpus is a small grammar over a fixed vocabulary: structured enough that a
 * model visibly learns it, generated from a fixed seed so every machine sees the same bytes. */
static const char *const SUBJECTS[] = {"the king", "a young knight", "the old queen", "my lord",
    "the fool", "a wise woman", "the merchant", "our captain", "the shepherd", "her brother"};
static const char *const VERBS[] = {"loves", "betrays", "follows", "remembers", "forgives",
    "fears", "praises", "defends", "mocks", "awaits"};
static const char *const OBJECTS[] = {"the crown", "his sword", "the northern sea", "a silver ring",
    "the quiet garden", "an honest heart", "the burning city", "her father", "the morning", "the gods"};
static const char *const ENDINGS[] = {".", ", and the night is long.", ", for the hour is late.",
    "; so it was written.", "!", ", as the bells ring."};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

DataSet *data_builtin(size_t bytes) {
    DataSet *d = dataset_new(bytes + 256);
    if (!d) return NULL;
    size_t n = 0;
    for (uint64_t i = 0; n < bytes; i++) {
        uint64_t h = rng_mix64(i);
        char line[256];
        int len = snprintf(line, sizeof line, "%s %s %s%s\n", SUBJECTS[h % COUNT(SUBJECTS)],
                           VERBS[(h >> 8) % COUNT(VERBS)], OBJECTS[(h >> 16) % COUNT(OBJECTS)],
                           ENDINGS[(h >> 24) % COUNT(ENDINGS)]);
        for (int j = 0; j < len; j++) d->tokens[n++] = (unsigned char)line[j];
    }
    d->n = n;
    snprintf(d->desc, sizeof d->desc, "built-in corpus (%zu bytes, bytewise tokens)", n);
    return d;
}

void data_batch(const DataSet *d, uint64_t seed, int64_t step, int micro, int B, int T,
                int *inputs, int *targets) {
    size_t windows = d->n - (size_t)T; /* valid start offsets: 0 .. n-T-1 */
    for (int b = 0; b < B; b++) {
        uint64_t h = rng_hash4(seed, (uint64_t)step, (uint64_t)micro, (uint64_t)b);
        size_t off = (size_t)(h % windows);
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = d->tokens[off + t];
            targets[b * T + t] = d->tokens[off + t + 1];
        }
    }
}

int data_write_shard(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errlen) {
    int32_t header[256] = {0};
    header[0] = DATA_SHARD_MAGIC;
    header[1] = DATA_SHARD_VERSION;
    header[2] = (int32_t)n;
    FILE *f = fopen(path, "wb");
    if (!f) { snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno)); return -1; }
    int ok = fwrite(header, sizeof header, 1, f) == 1 && fwrite(tokens, sizeof *tokens, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) { snprintf(err, errlen, "%s: write failed", path); return -1; }
    return 0;
}
