/* Memory read bandwidth of this machine: the ceiling a memory-bound decode step can reach.
 *
 * Reads a large buffer (default 1 GiB, far beyond any cache) with wide loads and independent
 * accumulators, so the loop is limited by memory, not by arithmetic; each thread reads its own
 * contiguous slice (pages first-touched by the thread that reads them). The buffer asks for
 * transparent huge pages (as kasoku's packed weights do), so page-table walks do not lower the
 * ceiling; --small-pages measures with 4 KiB pages instead. Every thread count is measured
 * best-of-N after one untimed pass; GB/s are 1e9 bytes per second.
 *
 *   gcc -O3 -march=native -fopenmp tools/bandwidth.c -o bandwidth      (tools/bandwidth.sh does this)
 *   ./bandwidth [--mib 1024] [--reps 7] [--threads 1,2] [--small-pages]  (default threads: 1 and all)
 *
 * Prints one JSON object on stdout:
 *   {"tool": "kasoku tools/bandwidth.c", "buffer_bytes": B, "reps": N, "max_threads": T,
 *    "results": [{"threads": t, "best_gbps": x, "median_gbps": y, "runs_gbps": [...]}, ...]}
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#ifdef __AVX2__
#include <immintrin.h>
#endif

#if defined(BW_AVX512) && defined(__AVX512F__)
#define LOADS "avx512"
#elif defined(__AVX2__)
#define LOADS "avx2"
#else
#define LOADS "scalar"
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sums n 64-bit words (n a multiple of 64); the result keeps the loads from being optimised away.
 * AVX2 (32-byte) loads, else scalar; 64-byte AVX-512 loads with -DBW_AVX512 (on the 2-core
 * EPYC VM they read 10-15% slower than AVX2, so they are not the default). */
static uint64_t read_slice(const uint64_t *p, size_t n) {
#if defined(BW_AVX512) && defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    __m512i a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 64) {
        const __m512i *v = (const __m512i *)(p + i);
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + 0));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + 3));
        a4 = _mm512_add_epi64(a4, _mm512_load_si512(v + 4));
        a5 = _mm512_add_epi64(a5, _mm512_load_si512(v + 5));
        a6 = _mm512_add_epi64(a6, _mm512_load_si512(v + 6));
        a7 = _mm512_add_epi64(a7, _mm512_load_si512(v + 7));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    a4 = _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7));
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(a0, a4));
#elif defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    __m256i a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 32) { /* n is a multiple of 64, so of 32 too */
        const __m256i *v = (const __m256i *)(p + i);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 0));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
        a4 = _mm256_add_epi64(a4, _mm256_load_si256(v + 4));
        a5 = _mm256_add_epi64(a5, _mm256_load_si256(v + 5));
        a6 = _mm256_add_epi64(a6, _mm256_load_si256(v + 6));
        a7 = _mm256_add_epi64(a7, _mm256_load_si256(v + 7));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    a4 = _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7));
    a0 = _mm256_add_epi64(a0, a4);
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    uint64_t s[8] = {0};
    for (size_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
#endif
}

/* One timed pass of `threads` threads over the whole buffer; returns seconds. */
static double pass(const uint64_t *buf, size_t words, int threads, volatile uint64_t *sink) {
    uint64_t total = 0;
    double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t chunk = (words / (size_t)nt) & ~(size_t)63;
        size_t start = (size_t)t * chunk;
        size_t len = (t == nt - 1) ? ((words - start) & ~(size_t)63) : chunk;
#pragma omp barrier
#pragma omp single
        t0 = now();
        total += read_slice(buf + start, len);
#pragma omp barrier
#pragma omp single
        t1 = now();
    }
    *sink += total;
    return t1 - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t mib = 1024;
    int reps = 7;
    int tlist[64], nt = 0;
    int max_threads = omp_get_num_procs();
    int small_pages = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
            mib = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *s = argv[++i];
            for (char *tok = strtok(s, ","); tok && nt < 64; tok = strtok(NULL, ",")) {
                int v = atoi(tok);
                if (v > 0) tlist[nt++] = v;
            }
        } else if (!strcmp(argv[i], "--small-pages")) {
            small_pages = 1;
        } else {
            fprintf(stderr, "usage: %s [--mib N] [--reps N] [--threads 1,2,...] [--small-pages]\n", argv[0]);
            return 2;
        }
    }
    if (mib < 64 || reps < 1) {
        fprintf(stderr, "need --mib >= 64 and --reps >= 1\n");
        return 2;
    }
    if (nt == 0) {
        tlist[nt++] = 1;
        if (max_threads > 1) tlist[nt++] = max_threads;
    }
    size_t bytes = mib << 20, words = bytes / 8;
    /* 2 MiB-aligned so that every page of the buffer can be a huge one. */
    uint64_t *buf = aligned_alloc(2u << 20, bytes);
#ifdef MADV_HUGEPAGE
    if (buf && !small_pages) madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    if (!buf) {
        fprintf(stderr, "cannot allocate %zu MiB\n", mib);
        return 1;
    }
    /* First touch by the threads that will read: pages land near them (NUMA) and are mapped. */
#pragma omp parallel for schedule(static) num_threads(max_threads)
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;

    volatile uint64_t sink = 0;
    printf("{\"tool\": \"kasoku tools/bandwidth.c\", \"loads\": \"%s\", \"buffer_bytes\": %zu, \"reps\": %d, "
           "\"max_threads\": %d, \"pages\": \"%s\", \"results\": [",
           LOADS, bytes, reps, max_threads, small_pages ? "small" : "huge (madvise)");
    double *gbps = malloc(sizeof(double) * (size_t)reps);
    for (int k = 0; k < nt; k++) {
        int threads = tlist[k];
        pass(buf, words, threads, &sink); /* warm-up, untimed */
        printf("%s{\"threads\": %d, \"runs_gbps\": [", k ? ", " : "", threads);
        for (int r = 0; r < reps; r++) {
            double s = pass(buf, words, threads, &sink);
            gbps[r] = (double)words * 8.0 / s / 1e9;
            printf("%s%.3f", r ? ", " : "", gbps[r]);
        }
        qsort(gbps, (size_t)reps, sizeof(double), cmp_double);
        printf("], \"best_gbps\": %.3f, \"median_gbps\": %.3f}", gbps[reps - 1], gbps[reps / 2]);
        fflush(stdout);
    }
    printf("], \"checksum\": %llu}\n", (unsigned long long)(sink & 0xffff));
    free(gbps);
    free(buf);
    return 0;
}
