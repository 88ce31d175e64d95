#include "tests/check.h"

#include <stdlib.h>

int check_passed, check_failed;

int check_done(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

char *check_slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b) {
        *n = fread(b, 1, (size_t)len, fp);
        b[*n] = 0;
    }
    fclose(fp);
    return b;
}
