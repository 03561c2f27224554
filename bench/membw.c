/* How fast this machine reads bytes that sit in the page cache, to compare content search with
 * (bench/README.md "Content search on 1 KiB values"): each file named is mapped (as the store
 * maps its segments), touched once, then read whole several times by
 *   sum     a plain sum of its 64-bit words (the compiler vectorises it): the read floor
 *   memcpy  a copy, 1 MiB at a time, into one 1 MiB buffer (which stays in L2)
 *   crc32c  the store's CRC-32C (crc32c_impl.h, the kernel every batch check uses)
 *   memmem  glibc memmem for a needle that occurs nowhere (the search's generic path)
 *   find    the search's own needle search (search_impl.h mqs_find, AVX2 where the CPU has it)
 *   crcfind the search's CRC and needle search in one pass (mqs_crc_find): what a scan runs
 *           over each batch's records
 * and the best pass of each is printed (then the same over the first HOT bytes of the first file,
 * read HOT_PASSES times: data in L2, what each kernel costs when memory is not the limit) in GB/s (10^9 bytes per second of this thread's CPU time,
 * so that other work on a shared machine does not count as this one's).
 *
 *   gcc -O3 -march=native -I src/mqcore/_ext -o /tmp/membw bench/membw.c
 *   /tmp/membw <segment>.log [...]
 */
#define _GNU_SOURCE 1
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "search_impl.h" /* and crc32c_impl.h */

#define PASSES 7
#define CHUNK (1 << 20)
#define HOT (512 << 10)
#define HOT_PASSES 400
#define KERNELS 6

static const char needle[] = "SegmentChecksumMismatch"; /* the benchmark's absent needle */
static const char *names[KERNELS] = {"sum", "memcpy", "crc32c", "memmem", "find", "crcfind"};
static unsigned char *dst;
static volatile uint64_t sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: this VM is shared */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run(int kernel, const unsigned char *p, size_t n)
{
    const unsigned char *nd = (const unsigned char *)needle;
    size_t m = sizeof needle - 1;
    uint32_t crc = 0;
    uint64_t s = 0;
    switch (kernel) {
    case 0:
        for (size_t i = 0; i < n / 8; i++)
            s += ((const uint64_t *)p)[i];
        break;
    case 1:
        for (size_t at = 0; at < n; at += CHUNK)
            memcpy(dst, p + at, n - at < CHUNK ? n - at : CHUNK);
        s = dst[0];
        break;
    case 2:
        s = mq_crc32c_extend(0, p, n);
        break;
    case 3:
        s = (uintptr_t)memmem(p, n, nd, m);
        break;
    case 4:
        s = (uintptr_t)mqs_find(p, n, nd, m);
        break;
    case 5:
        s = (uintptr_t)mqs_crc_find(&crc, p, n, nd, m) + crc;
        break;
    }
    sink += s;
}

/* The best of PASSES timings of each kernel, each timing `reps` reads of p[0:n]. */
static void measure(const unsigned char *p, size_t n, int reps, double t[KERNELS])
{
    for (int k = 0; k < KERNELS; k++)
        t[k] = 1e9;
    for (int pass = 0; pass < PASSES; pass++)
        for (int k = 0; k < KERNELS; k++) {
            double a = now();
            for (int r = 0; r < reps; r++)
                run(k, p, n);
            double b = now() - a;
            if (b < t[k])
                t[k] = b;
        }
}

int main(int argc, char **argv)
{
    double best[KERNELS] = {0}, hot[KERNELS] = {0}, t[KERNELS];
    size_t total = 0;
    dst = malloc(CHUNK);
    mqs_select(1);
    for (int f = 1; f < argc; f++) {
        int fd = open(argv[f], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            perror(argv[f]);
            return 1;
        }
        size_t n = (size_t)st.st_size;
        const unsigned char *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        run(0, p, n); /* fault every page in once, as the store's mapping is */
        measure(p, n, 1, t);
        for (int k = 0; k < KERNELS; k++)
            best[k] += t[k];
        total += n;
        if (f == 1 && n >= HOT)
            measure(p, HOT, HOT_PASSES, hot);
        munmap((void *)p, n);
        close(fd);
    }
    printf("%zu bytes in %d file(s), best of %d passes each (%s kernels):\n", total, argc - 1,
           PASSES, mqs_name);
    for (int k = 0; k < KERNELS; k++)
        printf("  %-7s %6.1f GB/s\n", names[k], total / best[k] / 1e9);
    if (hot[0] > 0) {
        printf("the first %d KiB, read %d times (in L2):\n", HOT >> 10, HOT_PASSES);
        for (int k = 0; k < KERNELS; k++)
            printf("  %-7s %6.1f GB/s\n", names[k], (double)HOT * HOT_PASSES / hot[k] / 1e9);
    }
    return 0;
}
