/* layout.h — where a rank sits in a 3D-parallel job (data x pipeline x tensor), Megatron-LM's
 * default order: tensor-parallel innermost, then data-parallel, pipeline outermost,
 *
 *     rank = t + TP * (d + DP * p),
 *
 * so a tensor-parallel group is TP consecutive ranks (one machine when it fits: `deadpool run`
 * gives each machine consecutive ranks) and a spare that takes rank r takes its coordinate.
 * Pure functions: the trainer, its callbacks and the tests share them. */
#ifndef DEADPOOL_LAYOUT_H
#define DEADPOOL_LAYOUT_H

#include <stddef.h>

#include "model.h"

typedef struct {
    int tp, pp, dp; /* degrees: world = tp * pp * dp */
} Layout;

typedef struct {
    int d, p, t; /* data-parallel replica, pipeline stage, tensor slice */
} Coord;

/* The layout of `world` ranks with --tp and --pp for the model cfg. 0, or -1 + err naming the
 * option, the expected and the found value. */
int layout_make(int world, int tp, int pp, const GPT2Config *cfg, Layout *out, char *err, size_t errlen);
/* The part of layout_make that needs no model: tp x pp divides the ranks. */
int layout_check_world(int world, int tp, int pp, char *err, size_t errlen);
Coord layout_coord(const Layout *l, int rank);
int layout_rank(const Layout *l, Coord c);
/* Stage p's layers [*l0, *l1): the L layers split as evenly as possible, earlier stages
 * taking the remainder. */
void layout_stage_layers(int L, int P, int p, int *l0, int *l1);
/* The model part at coordinate c. */
GPT2Part layout_part(const Layout *l, const GPT2Config *cfg, Coord c);

#endif
