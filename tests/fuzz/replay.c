/* A main() for the fuzz targets where libFuzzer is not there (gcc builds, CI's ctest): runs the
 * target once on every file of the given files and directories: the seed corpus and the crashers
 * kept as regressions. Any finding aborts under the sanitizers; the count of inputs is printed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        perror(path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(fp);
    if (!buf) return 1;
    /* an exact-size copy, so reading one byte past the input is caught by ASan */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue; /* an empty regressions folder may be absent */
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad += run_file(p);
            files++;
        }
        if (d) closedir(d);
    }
    printf("%s: %d inputs replayed\n", argv[0], files);
    return bad ? 1 : 0;
}
