/* rng.h — counter-based deterministic randomness shared by data sampling and fault injection.
 * splitmix64 finaliser: a pure function of its input, so "random" choices are reproducible
 * from (seed, step, rank, ...) without any hidden state. */
#ifndef DEADPOOL_RNG_H
#define DEADPOOL_RNG_H

#include <stdint.h>

static inline uint64_t rng_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Hash of a short tuple of integers. */
static inline uint64_t rng_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return rng_mix64(rng_mix64(rng_mix64(rng_mix64(a) ^ b) ^ c) ^ d);
}

#endif
