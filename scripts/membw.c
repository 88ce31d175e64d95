/* STREAM-like read bandwidth: threads sum disjoint slices of a 1 GiB buffer with AVX2 loads.
 * Build: cc -O2 -mavx2 -pthread scripts/membw.c -o membw; run: ./membw [threads] */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (1ul << 30)
static char *buf;
static int nth;
static double sink[64];

static void *reader(void *arg) {
    long t = (long)arg;
    size_t per = BYTES / nth;
    const __m256i *p = (const __m256i *)(buf + per * t), *e = (const __m256i *)(buf + per * (t + 1));
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < e; p += 4) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(p));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + 3));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    long long lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    sink[t] = (double)(lanes[0] + lanes[1] + lanes[2] + lanes[3]);
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    nth = argc > 1 ? atoi(argv[1]) : 1;
    if (nth < 1 || nth > 64) return 1;
    buf = aligned_alloc(64, BYTES);
    memset(buf, 1, BYTES);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        double t0 = now();
        for (long t = 0; t < nth; t++) pthread_create(&th[t], NULL, reader, (void *)t);
        for (int t = 0; t < nth; t++) pthread_join(th[t], NULL);
        double gbs = BYTES / (now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    if (sink[0] == 0) printf("(unexpected sum)\n");
    printf("read bandwidth, %d thread%s: %.1f GB/s (best of 5, 1 GiB)\n", nth, nth > 1 ? "s" : "", best);
    return 0;
}
