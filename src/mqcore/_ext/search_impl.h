/* Needle search kernels of search.pyx (the module comment there says how a scan uses them),
 * in a header of their own so bench/membw.c measures the very code the scan runs. Include it
 * once per module: its state (the chosen kernels, the CRC tables) is static. */
#ifndef MQ_SEARCH_IMPL_H
#define MQ_SEARCH_IMPL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1  /* glibc declares memmem under it; CPython's pyconfig.h sets it too */
#endif
#include <string.h>
/* repeated in case Python.h included string.h before _GNU_SOURCE was defined */
void *memmem(const void *, size_t, const void *, size_t);
/* this module's own copy of the CRC-32C kernels and tables (static): mqs_select inits it */
#include "crc32c_impl.h"

/* Needle search for the scan. Both functions need m >= 1 and return the first occurrence
   of nd[0:m] in p[0:n], or NULL:
     mqs_find(p, n, nd, m)
     mqs_crc_find(&crc, p, n, nd, m)  also extends the finished CRC-32C *crc over p[0:n]
   "generic": glibc memmem; the CRC and the search alternate over MQS_CHUNK-byte chunks so
   the search reads what the CRC just brought into cache.
   "avx2" (x86_64 with AVX2 and SSE4.2): 32 starts per step are candidates when the
   needle's first byte is at the start and its last byte m - 1 further (two compares, an
   AND, a movemask); the middle bytes of candidates are compared with memcmp. The CRC
   variant runs that search inside the CRC's three-chain loop (crc32c_impl.h): 96 starts
   per 12 CRC instructions, so the vector compares fill issue slots the CRC chains leave
   idle and each byte is loaded into L1 once for both. */
#define MQS_CHUNK 32768

typedef const unsigned char *(*mqs_find_fn)(const unsigned char *, size_t,
                                            const unsigned char *, size_t);
typedef const unsigned char *(*mqs_crc_find_fn)(uint32_t *, const unsigned char *, size_t,
                                                const unsigned char *, size_t);

static const unsigned char *mqs_find_generic(const unsigned char *p, size_t n,
                                             const unsigned char *nd, size_t m)
{
    return (const unsigned char *)memmem(p, n, nd, m);
}

static mqs_find_fn mqs_find = mqs_find_generic;

static const unsigned char *mqs_crc_find_generic(uint32_t *crc, const unsigned char *p,
                                                 size_t n, const unsigned char *nd, size_t m)
{
    const unsigned char *hit = NULL;
    size_t done = 0, k, back;
    while (done < n) {
        k = n - done < MQS_CHUNK ? n - done : MQS_CHUNK;
        *crc = mq_crc32c_extend(*crc, p + done, k);
        if (hit == NULL) {
            /* occurrences that end in this chunk: starts from m - 1 bytes before it */
            back = done < m - 1 ? done : m - 1;
            hit = mqs_find(p + done - back, k + back, nd, m);
        }
        done += k;
    }
    return hit;
}

static mqs_crc_find_fn mqs_crc_find = mqs_crc_find_generic;
static const char *mqs_name = "generic";

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MQS_AVX2 __attribute__((target("avx2,sse4.2")))

/* Bit i: q[i] is the needle's first byte and q[i + m - 1] its last. Reads q[0, 31 + m). */
static inline MQS_AVX2 uint32_t mqs_candidates(const unsigned char *q, size_t m,
                                               __m256i first, __m256i last)
{
    __m256i a = _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)q), first);
    __m256i b = _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(q + m - 1)), last);
    return (uint32_t)_mm256_movemask_epi8(_mm256_and_si256(a, b));
}

/* The first candidate of mask (bits for q[0..31]) whose middle bytes match, or NULL. */
static inline const unsigned char *mqs_confirm(const unsigned char *q, uint32_t mask,
                                               const unsigned char *nd, size_t m)
{
    const unsigned char *at;
    while (mask) {
        at = q + __builtin_ctz(mask);
        if (m <= 2 || memcmp(at + 1, nd + 1, m - 2) == 0)
            return at;
        mask &= mask - 1;
    }
    return NULL;
}

static MQS_AVX2 const unsigned char *mqs_find_avx2(const unsigned char *p, size_t n,
                                                   const unsigned char *nd, size_t m)
{
    __m256i first, last;
    const unsigned char *hit;
    uint32_t mask;
    size_t i, starts;
    if (m > n)
        return NULL;
    starts = n - m + 1;
    if (starts < 32) {
        for (i = 0; i < starts; i++)
            if (p[i] == nd[0] && memcmp(p + i, nd, m) == 0)
                return p + i;
        return NULL;
    }
    first = _mm256_set1_epi8((char)nd[0]);
    last = _mm256_set1_epi8((char)nd[m - 1]);
    for (i = 0; i + 32 <= starts; i += 32) {
        mask = mqs_candidates(p + i, m, first, last);
        if (mask && (hit = mqs_confirm(p + i, mask, nd, m)) != NULL)
            return hit;
    }
    if (i < starts) {
        /* the last starts: one vector ending flush with them, overlapping starts already
           found empty, so its first confirmed candidate is still the first occurrence */
        i = starts - 32;
        mask = mqs_candidates(p + i, m, first, last);
        if (mask && (hit = mqs_confirm(p + i, mask, nd, m)) != NULL)
            return hit;
    }
    return NULL;
}

/* One round of crc32c_impl.h's three-chain CRC over c[0, 3 * block) and, alongside, the
   search over the starts q[0, 3 * block); q may lie a few bytes before c. Reads
   q[0, 3 * block + m - 1). Sets *hit to the first occurrence unless it is already set. */
static inline MQS_AVX2 mq_crc32c_reg mqs_crc_find_round(
    mq_crc32c_reg crc, const unsigned char *c, const unsigned char *q, size_t block,
    uint32_t shift[4][256], const unsigned char *nd, size_t m, __m256i first,
    __m256i last, const unsigned char **hit)
{
    mq_crc32c_reg crc1 = 0, crc2 = 0;
    const unsigned char *end = c + block;
    uint32_t m0, m1, m2;
    do {
        crc = mq_crc32c_hw_word(crc, c);
        crc1 = mq_crc32c_hw_word(crc1, c + block);
        crc2 = mq_crc32c_hw_word(crc2, c + 2 * block);
        crc = mq_crc32c_hw_word(crc, c + 8);
        crc1 = mq_crc32c_hw_word(crc1, c + block + 8);
        crc2 = mq_crc32c_hw_word(crc2, c + 2 * block + 8);
        crc = mq_crc32c_hw_word(crc, c + 16);
        crc1 = mq_crc32c_hw_word(crc1, c + block + 16);
        crc2 = mq_crc32c_hw_word(crc2, c + 2 * block + 16);
        crc = mq_crc32c_hw_word(crc, c + 24);
        crc1 = mq_crc32c_hw_word(crc1, c + block + 24);
        crc2 = mq_crc32c_hw_word(crc2, c + 2 * block + 24);
        /* keeps GCC from splitting the chains into separate loops (see crc32c_impl.h) */
        __asm__("" : "+r"(crc), "+r"(crc1), "+r"(crc2));
        m0 = mqs_candidates(q, m, first, last);
        m1 = mqs_candidates(q + 32, m, first, last);
        m2 = mqs_candidates(q + 64, m, first, last);
        if (__builtin_expect((m0 | m1 | m2) != 0, 0) && *hit == NULL) {
            if ((*hit = mqs_confirm(q, m0, nd, m)) == NULL &&
                (*hit = mqs_confirm(q + 32, m1, nd, m)) == NULL)
                *hit = mqs_confirm(q + 64, m2, nd, m);
        }
        c += 32;
        q += 96;
    } while (c < end);
    crc = mq_crc32c_shift(shift, (uint32_t)crc) ^ crc1;
    return mq_crc32c_shift(shift, (uint32_t)crc) ^ crc2;
}

static MQS_AVX2 const unsigned char *mqs_crc_find_avx2(uint32_t *crc32,
                                                       const unsigned char *p, size_t n,
                                                       const unsigned char *nd, size_t m)
{
    const unsigned char *end = p + n, *hit = NULL;
    const unsigned char *c = p, *q = p;  /* CRC'd up to c; starts before q searched */
    mq_crc32c_reg crc = (uint32_t)~*crc32;
    __m256i first = _mm256_set1_epi8((char)nd[0]), last = _mm256_set1_epi8((char)nd[m - 1]);
    /* the CRC's words aligned to 8 bytes; the search lags by up to 7 bytes */
    while (c < end && ((uintptr_t)c & 7))
        crc = mq_crc32c_hw_byte(crc, *c++);
    while (hit == NULL && (size_t)(end - q) >= 3 * MQ_CRC32C_LONG + m + 7) {
        crc = mqs_crc_find_round(crc, c, q, MQ_CRC32C_LONG, mq_crc32c_long_shift, nd, m,
                                 first, last, &hit);
        c += 3 * MQ_CRC32C_LONG;
        q += 3 * MQ_CRC32C_LONG;
    }
    while (hit == NULL && (size_t)(end - q) >= 3 * MQ_CRC32C_SHORT + m + 7) {
        crc = mqs_crc_find_round(crc, c, q, MQ_CRC32C_SHORT, mq_crc32c_short_shift, nd, m,
                                 first, last, &hit);
        c += 3 * MQ_CRC32C_SHORT;
        q += 3 * MQ_CRC32C_SHORT;
    }
    if (hit == NULL)
        hit = mqs_find_avx2(q, (size_t)(end - q), nd, m);
    *crc32 = ~mq_crc32c_hw((uint32_t)crc, c, (size_t)(end - c));
    return hit;
}
#endif

/* Pick the kernels: the fastest this CPU runs when fast, else the generic ones (tests).
   Call with the GIL, before any scan can run concurrently. */
static void mqs_select(int fast)
{
    mq_crc32c_init();
    mqs_find = mqs_find_generic;
    mqs_crc_find = mqs_crc_find_generic;
    mqs_name = "generic";
#ifdef MQS_AVX2
    __builtin_cpu_init();
    if (fast && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("sse4.2")) {
        mqs_find = mqs_find_avx2;
        mqs_crc_find = mqs_crc_find_avx2;
        mqs_name = "avx2";
    }
#endif
}
#endif /* MQ_SEARCH_IMPL_H */
