/* modelfile.h — llm.c's GPT-2 model file format (read and write).
 *
 * 256 x int32 header: magic 20240326, version 3, max_seq_len, vocab_size, num_layers,
 * num_heads, channels, padded_vocab_size; then every parameter as fp32 in llm.c's order.
 * A file written here loads in llm.c's train_gpt2.c, and the other way round. */
#ifndef DEADPOOL_MODELFILE_H
#define DEADPOOL_MODELFILE_H

#include <stddef.h>
#include "model.h"

#define MODELFILE_MAGIC 20240326
#define MODELFILE_VERSION 3

/* Reads and validates the header only. 0, or -1 with err naming the file, field, expected
 * and found values. */
int modelfile_read_config(const char *path, GPT2Config *cfg, char *err, size_t errlen);
/* Reads the whole file into params (gpt2_num_params(cfg) floats). The file's config must
 * equal *cfg; its size must match exactly; every value must be finite. 0 / -1 + err. */
int modelfile_read(const char *path, const GPT2Config *cfg, float *params, char *err, size_t errlen);
/* Writes atomically (temporary file, fsync, rename). 0 / -1 + err. */
int modelfile_write(const char *path, const GPT2Config *cfg, const float *params, char *err, size_t errlen);

#endif
