/*
 * STREAM-style copy bandwidth, on all cores (OpenMP), for the decode roofline of
 * scripts/bench-vs-peers.
 *
 *   cc -O3 -march=native -fopenmp scripts/stream_copy.c -o build/stream_copy
 *   OMP_NUM_THREADS=2 build/stream_copy [MiB per array, default 512] [repetitions, default 10]
 *
 * Copies a[] -> b[] (double) with the iterations split statically over the threads, each thread
 * first touching the pages it copies later (so they are local and already faulted in). Counts
 * bytes read + bytes written (2 x array size per copy, as STREAM's "Copy" does; the write-allocate
 * read is not counted). The default arrays are 512 MiB each, 16x a 32 MiB L3, so no copy is
 * served from cache. Prints the best repetition (as STREAM does) and the median, and on its last
 * line `copy_bandwidth_bytes_per_s <best>` for scripts.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (mib == 0 || reps < 1) {
        fprintf(stderr, "usage: %s [MiB per array] [repetitions]\n", argv[0]);
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(double);
    double *a = aligned_alloc(64, n * sizeof(double));
    double *b = aligned_alloc(64, n * sizeof(double));
    if (!a || !b) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    long i;
#pragma omp parallel for schedule(static)
    for (i = 0; i < (long)n; i++) {
        a[i] = 1.0 + (double)(i & 1023);
        b[i] = 0.0;
    }
    double *t = malloc(reps * sizeof(double));
    double check = 0.0;
    for (int r = 0; r <= reps; r++) { /* repetition 0 is a warm-up */
        double t0 = now();
#pragma omp parallel for schedule(static)
        for (i = 0; i < (long)n; i++) b[i] = a[i];
        double dt = now() - t0;
        if (r > 0) t[r - 1] = dt;
        check += b[n / 2 + r];
    }
    qsort(t, reps, sizeof(double), cmp);
    double bytes = 2.0 * (double)n * sizeof(double);
    printf("threads %d, arrays 2 x %zu MiB, %d repetitions (checksum %g)\n", omp_get_max_threads(),
           mib, reps, check);
    printf("copy best   %.2f GB/s (%.4f s)\n", bytes / t[0] / 1e9, t[0]);
    printf("copy median %.2f GB/s (%.4f s)\n", bytes / t[reps / 2] / 1e9, t[reps / 2]);
    printf("copy_bandwidth_bytes_per_s %.0f\n", bytes / t[0]);
    free(a);
    free(b);
    free(t);
    return 0;
}
