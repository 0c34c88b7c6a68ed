/* checksum.c — CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum on every
 * snapshot, replica and checkpoint.
 *
 * Two implementations with the same result:
 *   - crc32c_sw: table-driven "slicing-by-8", portable, about 1-2 GB/s;
 *   - crc32c_hw: the SSE4.2 crc32 instruction. One instruction has a latency of 3 cycles
 *     but a throughput of 1 per cycle, so a single dependent chain runs at a third of what
 *     the unit can do. Big buffers are therefore cut into blocks of 3 x LONG bytes whose
 *     thirds are checksummed as three independent streams, then joined: the CRC of A||B is
 *     shift(crc(A), |B|) ^ crc0(B), where shift appends |B| zero bytes (a linear map over
 *     GF(2), applied here through four 256-entry tables) and crc0(B) is B's CRC started
 *     from a zero register. Same scheme as Mark Adler's crc32c.c.
 *   - crc32c_fold: where the CPU has VPCLMULQDQ and AVX-512, big buffers are folded instead:
 *     four 512-bit accumulators (16 lanes of 128 bits), each lane multiplied forward by x^D
 *     modulo the polynomial with carry-less multiplies and XORed onto the data D bits
 *     further, 256 bytes per iteration; the lanes are then folded into one 128-bit value
 *     with the same CRC as everything folded, which the crc32 instruction finishes. The
 *     method of Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"
 *     (Gopal et al., 2009); its constants are computed here from the polynomial (fold_key).
 *     About twice the three-way crc32 path on data in cache (57 against 28 GB/s here,
 *     test_checksum prints both): it is what a holder spends per byte it pulls.
 * crc32c() picks the fastest path at run time (__builtin_cpu_supports), so this file also
 * works in a build without -msse4.2 and on CPUs that lack the instructions.
 *
 * The CRC register is kept inverted inside the loops ("~crc" in, "~crc" out), which is the
 * usual init/final xor of 0xFFFFFFFF: crc32c(0, "123456789", 9) == 0xE3069283. */
#include "checksum.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CRC32C_HAVE_HW 1
#else
#define CRC32C_HAVE_HW 0
#endif

#define CRC32C_POLY 0x82F63B78u
#define CRC32C_POLY_NORMAL 0x1EDC6F41u /* the same polynomial, x^31 first (fold_key) */

/* Below this many bytes the fold's setup and final reduction do not pay. */
#define CRC32C_FOLD_MIN 1024

/* Stream lengths for the three-way hardware path. Powers of two (crc32c_zeros_op needs
 * that). LONG blocks carry big buffers; SHORT blocks pick up most of what is left so that
 * mid-sized buffers also run three streams. */
#define CRC32C_LONG 8192
#define CRC32C_SHORT 256

/* crc32c_copy works on chunks this big: the memcpy'ed chunk is still in L2 when the CRC
 * reads it back. A multiple of 3 * LONG so whole chunks take the three-stream path. */
#define CRC32C_COPY_CHUNK (4 * 3 * CRC32C_LONG)

static uint32_t sw_table[8][256];
static uint32_t shift_long[4][256];  /* appends LONG zero bytes to a raw CRC register */
static uint32_t shift_short[4][256]; /* appends SHORT zero bytes */
static int use_hw, use_fold;
/* Fold constants, one 128-bit pair per lane: (x^(D+32) mod P, x^(D-32) mod P), bit-reflected
 * and shifted left by one, for D = 2048 (a 256-byte iteration), 512 (one accumulator onto the
 * next) and 128 (one lane onto the next). */
static uint64_t fold_2048[2], fold_512[2], fold_128[2];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------------------------------- */
/* GF(2) operators for appending zero bytes                                               */
/* ------------------------------------------------------------------------------------- */

/* mat is a 32x32 bit matrix, one uint32_t per column: returns mat * vec. */
static uint32_t gf2_matrix_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_matrix_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_matrix_times(mat, mat[n]);
}

/* op = the operator that appends len zero bytes to a raw CRC register. len must be a
 * power of two. */
static void crc32c_zeros_op(uint32_t *op, size_t len) {
    uint32_t odd[32], even[32];
    /* operator for one zero bit: shift right, fold in the polynomial on a carry */
    odd[0] = CRC32C_POLY;
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_matrix_square(even, odd); /* 2 zero bits */
    gf2_matrix_square(odd, even); /* 4 zero bits */
    gf2_matrix_square(even, odd); /* 8 zero bits = one zero byte */
    uint32_t *cur = even, *next = odd;
    for (; len > 1; len >>= 1) { /* each squaring doubles the number of zero bytes */
        gf2_matrix_square(next, cur);
        uint32_t *t = cur;
        cur = next;
        next = t;
    }
    memcpy(op, cur, sizeof odd);
}

/* Tabulates the operator byte by byte, so applying it costs four lookups. */
static void crc32c_zeros_table(uint32_t table[4][256], size_t len) {
    uint32_t op[32];
    crc32c_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        table[0][n] = gf2_matrix_times(op, n);
        table[1][n] = gf2_matrix_times(op, n << 8);
        table[2][n] = gf2_matrix_times(op, n << 16);
        table[3][n] = gf2_matrix_times(op, n << 24);
    }
}

static inline uint32_t crc32c_shift(const uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

/* ------------------------------------------------------------------------------------- */
/* initialisation                                                                         */
/* ------------------------------------------------------------------------------------- */

static void init_sw_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        sw_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = sw_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = sw_table[0][c & 0xff] ^ (c >> 8);
            sw_table[k][n] = c;
        }
    }
}

/* x^n mod P for the polynomial in its normal form, bit-reflected and shifted left by one: the
 * factor that moves a reflected 64-bit half n - 32 bits (... see fold_keys) forward. With the
 * IEEE polynomial it gives the constants of Intel's paper (0x154442bd4 for n = 544). */
static uint64_t fold_key(unsigned n) {
    uint32_t r = 1;
    while (n--) r = (r << 1) ^ ((r & 0x80000000u) ? CRC32C_POLY_NORMAL : 0);
    uint32_t reflected = 0;
    for (int i = 0; i < 32; i++)
        if (r >> i & 1) reflected |= 1u << (31 - i);
    return (uint64_t)reflected << 1;
}

/* The low half of a lane holds the earlier bytes (the higher powers of x): it moves D + 32,
 * the high half D - 32 (the 32 being the CRC's own x^32, the reflection's offset). */
static void fold_keys(uint64_t key[2], unsigned d) {
    key[0] = fold_key(d + 32);
    key[1] = fold_key(d - 32);
}

static void crc32c_init(void) {
    init_sw_tables();
    crc32c_zeros_table(shift_long, CRC32C_LONG);
    crc32c_zeros_table(shift_short, CRC32C_SHORT);
    fold_keys(fold_2048, 2048);
    fold_keys(fold_512, 512);
    fold_keys(fold_128, 128);
#if CRC32C_HAVE_HW
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2");
    use_fold = use_hw && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
               __builtin_cpu_supports("pclmul");
#endif
}

/* ------------------------------------------------------------------------------------- */
/* software                                                                               */
/* ------------------------------------------------------------------------------------- */

static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v); /* no alignment or aliasing assumptions; compiles to one load */
    return v;
}

uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len) {
    pthread_once(&init_once, crc32c_init);
    const unsigned char *p = data;
    uint32_t c = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (len >= 8) {
        uint64_t w = load64(p) ^ c;
        c = sw_table[7][w & 0xff] ^ sw_table[6][(w >> 8) & 0xff] ^ sw_table[5][(w >> 16) & 0xff] ^
            sw_table[4][(w >> 24) & 0xff] ^ sw_table[3][(w >> 32) & 0xff] ^
            sw_table[2][(w >> 40) & 0xff] ^ sw_table[1][(w >> 48) & 0xff] ^ sw_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
#endif
    while (len--) c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

/* ------------------------------------------------------------------------------------- */
/* hardware                                                                               */
/* ------------------------------------------------------------------------------------- */

#if CRC32C_HAVE_HW
/* Three streams of `block` bytes each from p, joined into c0. */
__attribute__((target("sse4.2"))) static inline uint64_t
crc32c_hw_3way(uint64_t c0, const unsigned char *p, size_t block, const uint32_t shift[4][256]) {
    uint64_t c1 = 0, c2 = 0;
    const unsigned char *end = p + block;
    do {
        c0 = _mm_crc32_u64(c0, load64(p));
        c1 = _mm_crc32_u64(c1, load64(p + block));
        c2 = _mm_crc32_u64(c2, load64(p + 2 * block));
        p += 8;
    } while (p < end);
    c0 = crc32c_shift(shift, (uint32_t)c0) ^ c1;
    return crc32c_shift(shift, (uint32_t)c0) ^ c2;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t c = (uint32_t)~crc;
    /* align so the 8-byte loads below never straddle a cache line needlessly */
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 3 * CRC32C_LONG) {
        c = crc32c_hw_3way(c, p, CRC32C_LONG, shift_long);
        p += 3 * CRC32C_LONG;
        len -= 3 * CRC32C_LONG;
    }
    while (len >= 3 * CRC32C_SHORT) {
        c = crc32c_hw_3way(c, p, CRC32C_SHORT, shift_short);
        p += 3 * CRC32C_SHORT;
        len -= 3 * CRC32C_SHORT;
    }
    while (len >= 8) {
        c = _mm_crc32_u64(c, load64(p));
        p += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

#if CRC32C_HAVE_HW
#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))

/* x moved forward by the key's distance, onto next. */
FOLD_TARGET static inline __m512i fold512(__m512i x, __m512i key, __m512i next) {
    __m512i lo = _mm512_clmulepi64_epi128(x, key, 0x00), hi = _mm512_clmulepi64_epi128(x, key, 0x11);
    return _mm512_xor_si512(_mm512_xor_si512(lo, hi), next);
}

FOLD_TARGET static inline __m128i fold128(__m128i x, __m128i key, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(x, key, 0x00), hi = _mm_clmulepi64_si128(x, key, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* len >= CRC32C_FOLD_MIN (>= 256). */
FOLD_TARGET static uint32_t crc32c_fold(uint32_t crc, const unsigned char *p, size_t len) {
    __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_2048[1], (long long)fold_2048[0]));
    __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_512[1], (long long)fold_512[0]));
    __m128i k128 = _mm_set_epi64x((long long)fold_128[1], (long long)fold_128[0]);
    __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    /* the register's start value goes into the first four bytes (the usual init xor) */
    x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)~crc)));
    p += 256;
    len -= 256;
    for (; len >= 256; p += 256, len -= 256) {
        x0 = fold512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    __m512i x = fold512(fold512(fold512(x0, k512, x1), k512, x2), k512, x3);
    __m128i y = _mm512_extracti32x4_epi32(x, 0);
    y = fold128(y, k128, _mm512_extracti32x4_epi32(x, 1));
    y = fold128(y, k128, _mm512_extracti32x4_epi32(x, 2));
    y = fold128(y, k128, _mm512_extracti32x4_epi32(x, 3));
    for (; len >= 16; p += 16, len -= 16) y = fold128(y, k128, _mm_loadu_si128((const __m128i *)p));
    /* y has the CRC of everything folded: 16 bytes for the crc32 instruction, from zero */
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(y));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(y, 1));
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

/* ------------------------------------------------------------------------------------- */
/* public entry points                                                                    */
/* ------------------------------------------------------------------------------------- */

uint32_t crc32c(uint32_t crc, const void *data, size_t len) {
    pthread_once(&init_once, crc32c_init);
#if CRC32C_HAVE_HW
    if (use_fold && len >= CRC32C_FOLD_MIN) return crc32c_fold(crc, data, len);
    if (use_hw) return crc32c_hw(crc, data, len);
#endif
    return crc32c_sw(crc, data, len);
}

uint32_t crc32c_nofold(uint32_t crc, const void *data, size_t len) {
    pthread_once(&init_once, crc32c_init);
#if CRC32C_HAVE_HW
    if (use_hw) return crc32c_hw(crc, data, len);
#endif
    return crc32c_sw(crc, data, len);
}

const char *crc32c_path(void) {
    pthread_once(&init_once, crc32c_init);
    return use_fold ? "fold" : use_hw ? "sse4.2" : "software";
}

/* Copies n bytes with non-temporal stores where it can. A snapshot buffer is written now and
 * read much later (by a holder, or at a restore), so its lines need not displace the
 * training loop's working set from the cache; streaming stores also skip reading each
 * destination line before overwriting it, which makes the copy about a third cheaper. */
static void copy_streaming(unsigned char *d, const unsigned char *s, size_t n) {
#ifdef __SSE2__
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
#else
    memcpy(d, s, n);
#endif
}

uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (len > 0) {
        size_t n = len < CRC32C_COPY_CHUNK ? len : CRC32C_COPY_CHUNK;
        crc = crc32c(crc, s, n); /* brings the chunk into cache; the copy then reads it there */
        copy_streaming(d, s, n);
        d += n;
        s += n;
        len -= n;
    }
#ifdef __SSE2__
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
    return crc;
}
