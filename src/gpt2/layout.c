/* layout.c — ranks to (d, p, t) and back; see layout.h. */
#include "layout.h"

#include <stdio.h>

int layout_check_world(int world, int tp, int pp, char *err, size_t errlen) {
    if (tp < 1 || pp < 1 || world % (tp * pp) != 0) {
        snprintf(err, errlen, "--tp %d x --pp %d: expected a divisor of the %d ranks (the data-parallel degree is "
                 "ranks / (tp x pp))", tp, pp, world);
        return -1;
    }
    return 0;
}

int layout_make(int world, int tp, int pp, const GPT2Config *cfg, Layout *out, char *err, size_t errlen) {
    if (layout_check_world(world, tp, pp, err, errlen) != 0) return -1;
    if (cfg->num_heads % tp != 0) {
        snprintf(err, errlen, "--tp: expected a divisor of the model's %d attention heads, found %d", cfg->num_heads, tp);
        return -1;
    }
    if (pp > cfg->num_layers) {
        snprintf(err, errlen, "--pp: expected at most the model's %d layers, found %d", cfg->num_layers, pp);
        return -1;
    }
    *out = (Layout){tp, pp, world / (tp * pp)};
    return 0;
}

Coord layout_coord(const Layout *l, int rank) {
    return (Coord){(rank / l->tp) % l->dp, rank / (l->tp * l->dp), rank % l->tp};
}

int layout_rank(const Layout *l, Coord c) { return c.t + l->tp * (c.d + l->dp * c.p); }

void layout_stage_layers(int L, int P, int p, int *l0, int *l1) {
    int base = L / P, extra = L % P;
    *l0 = p * base + (p < extra ? p : extra);
    *l1 = *l0 + base + (p < extra ? 1 : 0);
}

GPT2Part layout_part(const Layout *l, const GPT2Config *cfg, Coord c) {
    GPT2Part q = {l->tp, c.t, 0, 0};
    layout_stage_layers(cfg->num_layers, l->pp, c.p, &q.layer0, &q.layer1);
    return q;
}
