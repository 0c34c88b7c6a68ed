/* generation.c — writing and checking the generation payload layout (generation.h). */
#include "generation.h"

#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(GenHead) == 32, "GenHead has no padding");
_Static_assert(sizeof(GenEntry) == 16, "GenEntry has no padding");

size_t gen_head_bytes(int nregions, size_t extra_len) {
    return sizeof(GenHead) + (size_t)nregions * sizeof(GenEntry) + extra_len;
}

int gen_block(int64_t gen, int every) {
    if (every < 1) every = 1;
    int64_t group = gen >= 0 ? gen / every : -1 - (-1 - gen) / every; /* floor division */
    return (int)(group & 1);
}

void gen_head_write(void *buf, uint64_t seed, int64_t next_step, const dp_region *r, int n, const void *extra,
                    size_t extra_len) {
    GenHead h = {.magic = GEN_MAGIC, .nregions = (uint32_t)n, .extra_len = extra_len, .seed = seed, .next_step = next_step};
    unsigned char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (int i = 0; i < n; i++) {
        GenEntry e = {.id = r[i].id, .kind = (uint32_t)r[i].kind, .len = r[i].len};
        memcpy(p, &e, sizeof e);
        p += sizeof e;
    }
    if (extra_len) memcpy(p, extra, extra_len);
}

int gen_parse(const void *payload, size_t len, dp_generation *g, dp_region *regions, int max, uint64_t *seed,
              int64_t *next_step, char *err, size_t errlen) {
    const unsigned char *p = payload;
    GenHead h;
    if (len < sizeof h) { snprintf(err, errlen, "generation of %zu bytes: shorter than its %zu-byte head", len, sizeof h); return -1; }
    memcpy(&h, p, sizeof h);
    if (h.magic != GEN_MAGIC) { snprintf(err, errlen, "generation: expected magic %08x, found %08x", GEN_MAGIC, h.magic); return -1; }
    if (h.nregions > (uint32_t)max) {
        snprintf(err, errlen, "generation: expected at most %d regions, found %u", max, h.nregions);
        return -1;
    }
    if (h.extra_len > len) { snprintf(err, errlen, "generation: extra state of %llu bytes in %zu", (unsigned long long)h.extra_len, len); return -1; }
    size_t off = gen_head_bytes((int)h.nregions, 0);
    if (off > len || len - off < h.extra_len) { snprintf(err, errlen, "generation: head and table overrun %zu bytes", len); return -1; }
    size_t data = off + h.extra_len;
    for (uint32_t i = 0; i < h.nregions; i++) {
        GenEntry e;
        memcpy(&e, p + sizeof h + i * sizeof e, sizeof e);
        if (e.kind > DP_IDENTICAL || e.len > len - data) {
            snprintf(err, errlen, "generation: region %u (id %u) of %llu bytes, kind %u, does not fit the %zu-byte payload",
                     i, e.id, (unsigned long long)e.len, e.kind, len);
            return -1;
        }
        for (uint32_t j = 0; j < i; j++)
            if (regions[j].id == e.id) { snprintf(err, errlen, "generation: region id %u appears twice", e.id); return -1; }
        regions[i] = (dp_region){.id = e.id, .kind = (dp_region_kind)e.kind, .ptr = (void *)(p + data), .len = e.len};
        data += e.len;
    }
    if (data != len) { snprintf(err, errlen, "generation: regions end at byte %zu of %zu", data, len); return -1; }
    g->extra = p + off;
    g->extra_len = h.extra_len;
    g->regions = regions;
    g->nregions = (int)h.nregions;
    *seed = h.seed;
    *next_step = h.next_step;
    return 0;
}

int gen_own_state(const void *payload, size_t len) {
    GenHead h;
    if (len < sizeof h) return 1; /* not a generation: assume the worst */
    memcpy(&h, payload, sizeof h);
    if (h.extra_len > 0 || h.nregions > (len - sizeof h) / sizeof(GenEntry)) return 1;
    for (uint32_t i = 0; i < h.nregions; i++) {
        GenEntry e;
        memcpy(&e, (const unsigned char *)payload + sizeof h + i * sizeof e, sizeof e);
        if (e.kind == DP_SHARDED) return 1;
    }
    return 0;
}
