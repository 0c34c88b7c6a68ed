/* train_options.c — the GPT-2 trainer's option table. */
#include "train_options.h"

#include <stdio.h>
#include <string.h>

#include "layout.h"
#include "options.h"

#define F(field) offsetof(TrainOptions, field)
#define S(field) offsetof(TrainOptions, field), sizeof(((TrainOptions *)0)->field)
static const OptSpec OPTIONS[] = {
    {"model", OPT_STR, S(model), 0, 0, NULL, "preset (micro, tiny, small, gpt2-124m) or llm.c model file"},
    {"data", OPT_STR, S(data), 0, 0, NULL, "llm.c token shard or text file (default: built-in corpus)"},
    {"batch", OPT_INT, F(batch), 0, 1, 65536, NULL, "sequences per micro-batch per rank (B)"},
    {"seq-len", OPT_INT, F(seq_len), 0, 0, 1 << 20, NULL, "tokens per sequence (T); 0 = model's max"},
    {"grad-accum", OPT_INT, F(grad_accum), 0, 1, 65536, NULL, "micro-batches per rank per step"},
    {"lr", OPT_FLOAT, F(lr), 0, 0, 10, NULL, "peak learning rate"},
    {"warmup", OPT_INT, F(warmup), 0, 0, 1e9, NULL, "linear warmup steps"},
    {"weight-decay", OPT_FLOAT, F(weight_decay), 0, 0, 10, NULL, "AdamW decoupled weight decay"},
    {"grad-clip", OPT_FLOAT, F(grad_clip), 0, 0, 1e9, NULL, "max global gradient norm (0 = off)"},
    {"final-lr-frac", OPT_FLOAT, F(final_lr_frac), 0, 0, 1, NULL, "cosine schedule floor, fraction of lr"},
    {"tp", OPT_INT, F(tp), 0, 1, 1024, NULL, "tensor-parallel degree (Megatron: heads and MLP split)"},
    {"pp", OPT_INT, F(pp), 0, 1, 1024, NULL, "pipeline-parallel degree (layers in stages, 1F1B over --grad-accum micro-batches)"},
    {"threads", OPT_INT, F(threads), 0, 1, 256, NULL, "BLAS threads per worker"},
};
#undef F
#undef S
static const OptTable TABLE = {OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0]};

void train_options_defaults(TrainOptions *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->model, sizeof o->model, "tiny");
    o->batch = 4;
    o->grad_accum = 1;
    o->lr = 1e-3f;
    o->grad_clip = 1.0f;
    o->final_lr_frac = 0.1f;
    o->threads = 1;
    o->tp = 1;
    o->pp = 1;
}

int train_options_has(const char *name) { return opt_find(TABLE, name) != NULL; }

int train_options_set(TrainOptions *o, const char *name, const char *value, char *err, size_t errlen) {
    return opt_set(TABLE, o, name, value, err, errlen);
}

int train_options_parse_args(TrainOptions *o, int argc, char **argv, char *err, size_t errlen) {
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        char name[64];
        const char *value;
        if (strncmp(arg, "--", 2) != 0) { snprintf(err, errlen, "unexpected argument '%s'", arg); return -1; }
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg - 2), arg + 2);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg + 2);
            if (i + 1 >= argc) { snprintf(err, errlen, "option --%s needs a value", name); return -1; }
            value = argv[++i];
        }
        if (opt_set(TABLE, o, name, value, err, errlen) != 0) return -1;
    }
    return 0;
}

int train_options_validate(const TrainOptions *o, int steps, int world, char *err, size_t errlen) {
    if (!o->model[0]) { snprintf(err, errlen, "--model: expected a preset or a file, found nothing"); return -1; }
    /* the layout against a preset's shape now; a model file's is checked once it is read */
    GPT2Config mc;
    Layout lay;
    if (gpt2_preset(o->model, &mc) == 0 ? layout_make(world, o->tp, o->pp, &mc, &lay, err, errlen) != 0
                                        : layout_check_world(world, o->tp, o->pp, err, errlen) != 0)
        return -1;
    if (o->warmup > steps) {
        snprintf(err, errlen, "--warmup: expected <= --steps (%d), found %d", steps, o->warmup);
        return -1;
    }
    return 0;
}

void train_options_print_help(void) {
    TrainOptions d;
    train_options_defaults(&d);
    opt_print_help(TABLE, &d);
}
