/* data.h — training data: llm.c token shards or plain text, and the batch sampler.
 *
 * A data set is loaded into memory once. The batch for (seed, step, micro-batch index) is a
 * pure function of those three numbers, so any process — including a spare that takes over a
 * rank — draws exactly the tokens the failed rank would have drawn. */
#ifndef DEADPOOL_DATA_H
#define DEADPOOL_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct DataSet DataSet;

#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_VERSION 1

/* Opens `path`: an llm.c token shard (256 x int32 header, magic 20240520, version 1, token
 * count, then uint16 tokens) when the file starts with that magic, else plain text tokenised
 * bytewise (ids 0..255). Every token must be < vocab_size. NULL + err naming the file and
 * field on failure. */
DataSet *data_open(const char *path, int vocab_size, char *err, size_t errlen);
/* The built-in corpus: deterministic generated English-like text (about `bytes` bytes), so the
 * default job needs no download. */
DataSet *data_builtin(size_t bytes);
void data_free(DataSet *d);

size_t data_num_tokens(const DataSet *d);
const char *data_describe(const DataSet *d); /* e.g. "shard 'x.bin' (1234 tokens)" */

/* Fills inputs/targets (B x T) for micro-batch `micro` of step `step`: B windows of T+1
 * tokens at offsets drawn from a counter-based hash of (seed, step, micro, b). Requires
 * data_num_tokens(d) > T. */
void data_batch(const DataSet *d, uint64_t seed, int64_t step, int micro, int B, int T,
                int *inputs, int *targets);

/* Writes tokens as an llm.c token shard (for tests and `deadpool` tooling). 0 / -1 + err. */
int data_write_shard(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errlen);

#endif
