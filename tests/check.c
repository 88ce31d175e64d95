#include "check.h"

int check_passed, check_failed;

int check_done(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
