/* fuzz_checkpoint.c — checkpoint files from untrusted bytes: state files (src/data/checkpoint.c:
 * checkpoint_read_state, SnapHeader + payload with CRC32C), the generation payload inside them
 * (src/data/generation.c: gen_parse) and a checkpoint's MANIFEST (checkpoint_verify).
 *
 * Each input is used four ways:
 *   1. as a whole state file, read by checkpoint_read_state as `deadpool run --resume` does;
 *   2. as the same file with a well-formed header around the input's payload (magic,
 *      version, job, rank 0, length and both CRCs fixed up), so the fuzzer reaches the
 *      payload checks and gen_parse instead of stopping at the checksums;
 *   3. as a bare generation payload for gen_parse;
 *   4. as the MANIFEST of a complete checkpoint (DONE present) whose rank_00000.state is the
 *      input too, verified by checkpoint_verify as --resume verifies every checkpoint.
 * Whatever is accepted must be consistent: the payload as long as the header says, the
 * regions inside it, back to back, ending exactly at its end; a refusal must say why. */
#include "fuzz_util.h"

#include <stddef.h>

#include "checkpoint.h"
#include "checksum.h"
#include "generation.h"
#include "replica.h"

static void check_generation(const uint8_t *payload, size_t len) {
    dp_generation g;
    dp_region regions[GEN_MAX_REGIONS];
    uint64_t seed;
    int64_t next;
    char err[512] = "";
    if (gen_parse(payload, len, &g, regions, GEN_MAX_REGIONS, &seed, &next, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != 0, "gen_parse refused without a message");
        return;
    }
    FUZZ_CHECK(g.nregions >= 0 && g.nregions <= GEN_MAX_REGIONS, "%d regions", g.nregions);
    const uint8_t *at = (const uint8_t *)g.extra + g.extra_len, *end = payload + len;
    FUZZ_CHECK((const uint8_t *)g.extra >= payload && at <= end, "extra state outside the payload");
    for (int i = 0; i < g.nregions; i++) {
        const dp_region *r = &g.regions[i];
        FUZZ_CHECK(r->ptr == at && r->len <= (size_t)(end - at), "region %d outside the payload", i);
        FUZZ_CHECK(r->kind == DP_SHARDED || r->kind == DP_IDENTICAL, "region %d of kind %d", i, (int)r->kind);
        for (int j = 0; j < i; j++) FUZZ_CHECK(g.regions[j].id != r->id, "region id %u twice", r->id);
        at += r->len;
    }
    FUZZ_CHECK(at == end, "regions end %td bytes before the payload does", end - at);
}

#define STEP_DIR "ckpt/step_000000001" /* checkpoint_path's name for step 0 */

static void read_state(const uint8_t *data, size_t size) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/" STEP_DIR, fuzz_tree_file(STEP_DIR "/rank_00000.state", data, size));
    SnapHeader h;
    void *payload = NULL;
    char err[1024] = "";
    if (checkpoint_read_state(dir, 0, -1, &h, &payload, err, sizeof err) != 0) {
        FUZZ_CHECK(payload == NULL, "payload left allocated after a refusal");
        FUZZ_CHECK_ERR(err, dir);
        return;
    }
    FUZZ_CHECK(snap_header_check(&h) == NULL && h.rank == 0, "accepted a bad header");
    FUZZ_CHECK(size == sizeof h + h.length, "accepted %zu bytes for a %llu-byte payload", size,
               (unsigned long long)h.length);
    FUZZ_CHECK(crc32c(0, payload, h.length) == h.crc, "accepted a payload that fails its CRC");
    check_generation(payload, h.length);
    free(payload);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_state(data, size);

    /* A sealed header around the input: the payload's own checks and gen_parse. */
    uint8_t *file = malloc(sizeof(SnapHeader) + size);
    FUZZ_CHECK(file != NULL, "out of memory");
    SnapHeader h;
    memset(&h, 0, sizeof h);
    if (size >= sizeof h) memcpy(&h, data, sizeof h); /* epoch, world, step from the input */
    h.magic = SNAP_MAGIC;
    h.version = SNAP_VERSION;
    memset(h.job, 0, sizeof h.job);
    snprintf(h.job, sizeof h.job, "fuzz");
    h.rank = 0;
    if (h.world < 1) h.world = 1;
    h.length = size;
    h.crc = crc32c(0, data, size);
    snap_header_seal(&h);
    memcpy(file, &h, sizeof h);
    if (size) memcpy(file + sizeof h, data, size);
    read_state(file, sizeof h + size);
    free(file);

    check_generation(data, size);

    /* The input as a MANIFEST (the state file beside it is the input too, from step 1). */
    const char *root = fuzz_tree_file(STEP_DIR "/MANIFEST", data, size);
    static int done_written;
    if (!done_written) {
        fuzz_tree_file(STEP_DIR "/DONE", (const uint8_t *)"0\n", 2);
        done_written = 1;
    }
    fuzz_tree_file(STEP_DIR "/rank_00000.state", data, size);
    char err[1024] = "";
    if (checkpoint_verify(root, 0, err, sizeof err) != 0) FUZZ_CHECK(err[0] != 0, "checkpoint_verify refused without a message");
    return 0;
}
