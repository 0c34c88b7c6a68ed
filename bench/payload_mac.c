/* payload_mac.c — what authenticating a payload on the wire costs.
 *
 * A replica PUT over TCP (a holder on another machine) and a GET (a spare restoring) carry a
 * Poly1305 tag over their payload, computed piece by piece as the bytes go out or land
 * (replica.c); a data-plane DATA frame carries Poly1305 or, where both ends run AES-256-GCM,
 * GMAC (comm_auth.h). This prints, for BYTES of state, the CPU time of each tag on one side
 * beside the CRC32C every replica transfer already computes, and beside the MACs that were
 * not chosen (keyed BLAKE2b, HMAC-SHA-512-256): the best of REPS repetitions each, on
 * transparent huge pages, Poly1305 in the 256 KiB pieces the holder verifies in, GMAC in one
 * call (libsodium's AES-GCM has no piecewise additional data). A same-machine PUT (PULL)
 * pays none of it.
 * usage: payload_mac [MIB] [REPS]   (default 31 MiB: `small`'s state per rank at 4 ranks) */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

#include "checksum.h"
#include "util.h"

#define PIECE (256u << 10)

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 31;
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (mib == 0 || reps < 1 || sodium_init() < 0) {
        fprintf(stderr, "usage: payload_mac [MIB] [REPS]\n");
        return 2;
    }
    size_t n = mib << 20;
    unsigned char *p = alloc_huge(n), key[32], tag[32];
    if (!p) return 1;
    randombytes_buf(p, n);
    randombytes_buf(key, sizeof key);
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
    int gcm = crypto_aead_aes256gcm_is_available();
    crypto_aead_aes256gcm_state gst;
    if (gcm) crypto_aead_aes256gcm_beforenm(&gst, key);
    unsigned char npub[crypto_aead_aes256gcm_NPUBBYTES] = {0};
    volatile uint32_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t = thread_cpu_ms();
        sink ^= crc32c(0, p, n);
        double crc = thread_cpu_ms() - t;
        t = thread_cpu_ms();
        crypto_onetimeauth_state st;
        crypto_onetimeauth_init(&st, key);
        for (size_t off = 0; off < n; off += PIECE) crypto_onetimeauth_update(&st, p + off, n - off < PIECE ? n - off : PIECE);
        crypto_onetimeauth_final(&st, tag);
        double poly = thread_cpu_ms() - t;
        t = thread_cpu_ms();
        crypto_generichash(tag, 32, p, n, key, sizeof key);
        double blake = thread_cpu_ms() - t;
        t = thread_cpu_ms();
        crypto_auth(tag, p, n, key);
        double hmac = thread_cpu_ms() - t;
        t = thread_cpu_ms();
        unsigned long long tl;
        npub[0] = (unsigned char)r; /* a nonce per use, as the data plane's */
        unsigned char none[1];
        if (gcm) crypto_aead_aes256gcm_encrypt_detached_afternm(none, tag, &tl, NULL, 0, p, n, NULL, npub, &gst);
        double gmac = gcm ? thread_cpu_ms() - t : 0;
        double got[5] = {crc, poly, blake, hmac, gmac};
        for (int i = 0; i < 5; i++)
            if (got[i] < best[i]) best[i] = got[i];
    }
    printf("%zu MiB, CPU ms on one side, best of %d: CRC32C %.1f | Poly1305 %.1f (%.2f GB/s) | GMAC %s%.1f (%.2f GB/s) | "
           "keyed BLAKE2b %.1f | HMAC-SHA-512-256 %.1f\n",
           mib, reps, best[0], best[1], n / best[1] / 1e6, gcm ? "" : "(not available) ", best[4],
           gcm ? n / best[4] / 1e6 : 0.0, best[2], best[3]);
    free(p);
    return (int)(sink & 0);
}
