/* test_checksum.c — CRC32C: published check values, incremental == one-shot, the hardware
 * path == the software reference on many lengths and alignments, crc32c_copy == copy +
 * crc32c, single-bit sensitivity; prints the measured throughput (not asserted). */
#include "checksum.h"
#include "harness.h"
#include "rng.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill_random(unsigned char *buf, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rng_hash4(seed, i, 0, 0);
}

static void test_known_vectors(void) {
    unsigned char zeros[32], ones[32];
    memset(zeros, 0, sizeof zeros);
    memset(ones, 0xFF, sizeof ones);
    CHECK(crc32c(0, "123456789", 9) == 0xE3069283u, "got %08x", crc32c(0, "123456789", 9));
    CHECK(crc32c_sw(0, "123456789", 9) == 0xE3069283u, "got %08x", crc32c_sw(0, "123456789", 9));
    CHECK(crc32c(0, "", 0) == 0, "empty input");
    CHECK(crc32c(0, NULL, 0) == 0, "empty input, NULL pointer");
    CHECK(crc32c(0x12345678u, "x", 0) == 0x12345678u, "zero length keeps the running crc");
    CHECK(crc32c(0, zeros, 32) == 0x8A9136AAu, "got %08x", crc32c(0, zeros, 32));
    CHECK(crc32c(0, ones, 32) == 0x62A8AB43u, "got %08x", crc32c(0, ones, 32));
    CHECK(crc32c_sw(0, zeros, 32) == 0x8A9136AAu, "sw zeros");
    CHECK(crc32c_sw(0, ones, 32) == 0x62A8AB43u, "sw ones");
}

static void test_incremental_equals_one_shot(void) {
    size_t n = 300000;
    unsigned char *buf = malloc(n);
    fill_random(buf, n, 1);
    uint32_t whole = crc32c(0, buf, n);
    for (int trial = 0; trial < 200; trial++) {
        uint32_t c = 0;
        size_t pos = 0;
        int pieces = 0;
        while (pos < n) {
            /* piece sizes from 0 to ~64 KiB, so pieces cross every path of crc32c_hw */
            size_t piece = rng_hash4(2, (uint64_t)trial, (uint64_t)pieces, 0) % 70000;
            if (piece > n - pos) piece = n - pos;
            c = (pieces & 1) ? crc32c_sw(c, buf + pos, piece) : crc32c(c, buf + pos, piece);
            pos += piece;
            pieces++;
        }
        CHECK(c == whole, "trial %d: %08x != %08x", trial, c, whole);
    }
    free(buf);
}

static void test_hw_equals_sw(void) {
    printf("# crc32c path for big buffers: %s\n", crc32c_path());
    size_t cap = (1u << 20) + 64;
    unsigned char *buf = malloc(cap);
    fill_random(buf, cap, 3);
    int bad = 0;
    /* every length up to 4 KiB at every alignment in a cache line's first 16 bytes */
    for (size_t len = 0; len <= 4096 && bad < 5; len++)
        for (size_t align = 0; align < 16; align++) {
            uint32_t seed = (uint32_t)rng_hash4(4, len, align, 0);
            uint32_t h = crc32c(seed, buf + align, len), s = crc32c_sw(seed, buf + align, len);
            uint32_t n = crc32c_nofold(seed, buf + align, len);
            if ((h != s || n != s) && bad++ < 5)
                CHECK(h == s && n == s, "len %zu align %zu: %08x, without the fold %08x, software %08x", len, align, h, n, s);
        }
    /* lengths around the three-stream block sizes (3 x 256 and 3 x 8192), the fold's 256-byte
     * iterations and 16-byte tail steps, and random big ones */
    size_t edges[] = {767, 768, 769, 775, 776, 1023, 1024, 1025, 1039, 1040, 1279, 1280, 1296, 1535, 1536, 1537,
                      24575, 24576, 24577, 24583, 24584, 49151, 49152, 49153, 49920, 98304 + 768 + 7};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        for (size_t align = 0; align < 9; align++) {
            uint32_t h = crc32c(7, buf + align, edges[i]), s = crc32c_sw(7, buf + align, edges[i]);
            uint32_t n = crc32c_nofold(7, buf + align, edges[i]);
            CHECK(h == s && n == s, "len %zu align %zu: %08x, without the fold %08x, software %08x", edges[i], align, h,
                  n, s);
        }
    for (int trial = 0; trial < 100; trial++) {
        size_t align = rng_hash4(5, (uint64_t)trial, 0, 0) % 64;
        size_t len = rng_hash4(5, (uint64_t)trial, 1, 0) % (cap - 64);
        uint32_t h = crc32c(0, buf + align, len), s = crc32c_sw(0, buf + align, len);
        uint32_t n = crc32c_nofold(0, buf + align, len);
        CHECK(h == s && n == s, "len %zu align %zu: %08x, without the fold %08x, software %08x", len, align, h, n, s);
    }
    free(buf);
}

static void test_copy_equals_crc_plus_copy(void) {
    size_t cap = (3u << 20) + 100;
    unsigned char *src = malloc(cap), *dst = malloc(cap + 16);
    fill_random(src, cap, 6);
    size_t lens[] = {0, 1, 7, 8, 100, 4096, 65535, 65536, 65537, 98303, 98304, 98305, 1u << 20, cap - 16};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t da = 0; da < 3; da++) {
            size_t sa = (i + da) % 5;
            memset(dst, 0xA5, cap + 16);
            uint32_t c = crc32c_copy(0x0BADF00Du, dst + da, src + sa, lens[i]);
            CHECK(c == crc32c(0x0BADF00Du, src + sa, lens[i]), "len %zu: crc differs", lens[i]);
            CHECK(memcmp(dst + da, src + sa, lens[i]) == 0, "len %zu: copy differs", lens[i]);
            CHECK(dst[da + lens[i]] == 0xA5, "len %zu: wrote past the end", lens[i]);
            if (da) CHECK(dst[da - 1] == 0xA5, "len %zu: wrote before the start", lens[i]);
        }
    free(src);
    free(dst);
}

static void test_single_bit_flip_changes_crc(void) {
    size_t n = 100000;
    unsigned char *buf = malloc(n);
    fill_random(buf, n, 7);
    uint32_t base = crc32c(0, buf, n);
    int unchanged = 0;
    for (int trial = 0; trial < 2000; trial++) {
        size_t byte = rng_hash4(8, (uint64_t)trial, 0, 0) % n;
        unsigned char bit = (unsigned char)(1u << (trial % 8));
        buf[byte] ^= bit;
        if (crc32c(0, buf, n) == base) unchanged++;
        buf[byte] ^= bit;
    }
    /* the first and the last byte too: no edge of the buffer is outside the checksum */
    size_t edges[] = {0, n - 1};
    for (int i = 0; i < 2; i++) {
        buf[edges[i]] ^= 0x80;
        if (crc32c(0, buf, n) == base) unchanged++;
        buf[edges[i]] ^= 0x80;
    }
    CHECK(unchanged == 0, "%d single-bit flips left the crc unchanged", unchanged);
    CHECK(crc32c(0, buf, n) == base, "restored buffer gives the original crc");
    free(buf);
}

/* Prints GB/s of crc32c, crc32c_sw and crc32c_copy on a 64 MiB buffer (not asserted). */
static void test_throughput_report(void) {
    size_t n = 64u << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    fill_random(src, n, 9);
    memcpy(dst, src, n); /* fault the pages in before timing */
    volatile uint32_t sink = 0;
    double best_hw = 1e9, best_sw = 1e9, best_copy = 1e9, best_memcpy = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = seconds_now();
        sink ^= crc32c(0, src, n);
        double t1 = seconds_now();
        if (rep < 2) sink ^= crc32c_sw(0, src, n);
        double t2 = seconds_now();
        sink ^= crc32c_copy(0, dst, src, n);
        double t3 = seconds_now();
        memcpy(dst, src, n);
        double t4 = seconds_now();
        if (t1 - t0 < best_hw) best_hw = t1 - t0;
        if (rep < 2 && t2 - t1 < best_sw) best_sw = t2 - t1;
        if (t3 - t2 < best_copy) best_copy = t3 - t2;
        if (t4 - t3 < best_memcpy) best_memcpy = t4 - t3;
    }
    double gb = (double)n / 1e9;
    printf("# crc32c %.1f GB/s, crc32c_sw %.1f GB/s, crc32c_copy %.1f GB/s (memcpy alone %.1f GB/s), 64 MiB\n",
           gb / best_hw, gb / best_sw, gb / best_copy, gb / best_memcpy);
    CHECK(crc32c(0, dst, n) == crc32c(0, src, n), "copy of the benchmark buffer");
    /* in cache, as a holder checksums each chunk it has just pulled */
    size_t chunk = 256u << 10;
    double best_fold = 1e9, best_nofold = 1e9;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = seconds_now();
        for (int i = 0; i < 16; i++) sink ^= crc32c(0, src, chunk);
        double t1 = seconds_now();
        for (int i = 0; i < 16; i++) sink ^= crc32c_nofold(0, src, chunk);
        double t2 = seconds_now();
        if (t1 - t0 < best_fold) best_fold = t1 - t0;
        if (t2 - t1 < best_nofold) best_nofold = t2 - t1;
    }
    printf("# 256 KiB in cache: crc32c (%s) %.1f GB/s, without the fold %.1f GB/s\n", crc32c_path(),
           16 * chunk / 1e9 / best_fold, 16 * chunk / 1e9 / best_nofold);
    free(src);
    free(dst);
}

int main(void) {
    RUN_TEST(test_known_vectors);
    RUN_TEST(test_incremental_equals_one_shot);
    RUN_TEST(test_hw_equals_sw);
    RUN_TEST(test_copy_equals_crc_plus_copy);
    RUN_TEST(test_single_bit_flip_changes_crc);
    RUN_TEST(test_throughput_report);
    TEST_MAIN_END();
}
