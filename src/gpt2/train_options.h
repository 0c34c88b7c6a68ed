/* train_options.h — the built-in GPT-2 trainer's options (`deadpool run --model ... --lr ...`):
 * the model, the data and the optimizer. Steps, seed and the output directory are the job's
 * (deadpool.h: dp_steps, dp_seed, dp_out_dir). */
#ifndef DEADPOOL_TRAIN_OPTIONS_H
#define DEADPOOL_TRAIN_OPTIONS_H

#include <stddef.h>

typedef struct {
    char model[1024];     /* preset name or llm.c model file */
    char data[1024];      /* token shard or text file; "" = built-in corpus */
    int batch;            /* sequences per micro-batch (B) */
    int seq_len;          /* tokens per sequence (T); 0 = the model's max_seq_len */
    int grad_accum;       /* micro-batches per rank per step */
    float lr, weight_decay, grad_clip, final_lr_frac;
    int warmup;           /* warmup steps */
    int threads;          /* BLAS threads per worker */
    int tp, pp;           /* tensor- and pipeline-parallel degrees (layout.h) */
} TrainOptions;

void train_options_defaults(TrainOptions *o);
/* 1 if `name` is one of the trainer's options. */
int train_options_has(const char *name);
/* Sets one option from text. 0 / -1 + err naming the option, expected and found value. */
int train_options_set(TrainOptions *o, const char *name, const char *value, char *err, size_t errlen);
/* Parses "--name value" / "--name=value" arguments. 0 / -1 + err. */
int train_options_parse_args(TrainOptions *o, int argc, char **argv, char *err, size_t errlen);
/* Cross-field checks against the job's steps and ranks (the --tp x --pp layout). 0 / -1 + err. */
int train_options_validate(const TrainOptions *o, int steps, int world, char *err, size_t errlen);
void train_options_print_help(void);

#endif
