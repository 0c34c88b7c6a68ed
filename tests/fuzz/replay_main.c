/* replay_main.c — a main for the fuzz harnesses where libFuzzer is not available (no clang):
 * runs LLVMFuzzerTestOneInput once on each file named, or on each file of each directory
 * named, as `fuzz_NAME FILE...` does. `make fuzz-replay` builds build/fuzz/replay_NAME with
 * $(CC) under ASan+UBSan; tests/e2e_fuzz.sh uses them to replay tests/fuzz/regress/. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "%s: cannot open\n", path); return -1; }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "%s: out of memory\n", path); return -1; }
    uint8_t *exact = malloc(n ? n : 1); /* exactly n bytes, so ASan sees any overread */
    if (n) memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    fprintf(stderr, "Executed %s (%zu bytes)\n", path, n);
    return 0;
}

int main(int argc, char **argv) {
    int runs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (argv[i][0] == '-') continue; /* libFuzzer flags: ignored */
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "%s: not found\n", argv[i]); bad++; continue; }
        if (!S_ISDIR(st.st_mode)) { bad += run_file(argv[i]) != 0; runs++; continue; }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad += run_file(path) != 0;
            runs++;
        }
        if (d) closedir(d);
    }
    fprintf(stderr, "replayed %d inputs\n", runs);
    return bad ? 1 : 0;
}
