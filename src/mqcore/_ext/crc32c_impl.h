/*
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) for mqcore's crc32c kernel.
 *
 * Everything below works on the raw CRC register (no pre/post inversion); mq_crc32c_extend and
 * mq_crc32c_extend_sw add the inversions, so CRCs chain like zlib's crc32().
 *
 * Implementations, chosen once by mq_crc32c_init() (crc32c.pyx calls it at import):
 *   software   slice-by-8: eight 256-entry tables, eight bytes per step.
 *   sse4.2     x86_64 CRC32 instruction. Only the functions that use it are compiled for SSE4.2
 *              (target attribute), so the module runs on CPUs without it; picked when
 *              __builtin_cpu_supports("sse4.2") says so.
 *   armv8-crc  AArch64 CRC32CX/CRC32CB; picked when AT_HWCAP has HWCAP_CRC32 (Linux), always on
 *              Apple arm64 and on builds that target CRC anyway.
 *
 * The CRC instruction has a latency of about three cycles but issues once per cycle, so one
 * dependency chain uses a third of it. Long buffers are therefore cut into three adjacent blocks
 * of B bytes, run as three independent chains (the second and third from 0) and joined with
 *     crc(X || Y) = shift_|Y|(crc(X)) ^ crc_from_0(Y)
 * where shift_n ("append n zero bytes") is multiplication by x^(8n) mod P: a linear map, applied
 * with four 256-entry tables made at init for B = 8192 and B = 256. Shorter buffers and tails
 * use a single chain.
 *
 *   sse4.2+vpclmulqdq  x86_64 CPUs that also have AVX2 and VPCLMULQDQ (Intel Ice Lake, AMD Zen 3
 *              and later): the CRC32 unit and the carry-less multiplier run side by side, about
 *              1.5x the three chains alone (27 against 42 us a MiB on Zen 3). See "Folding"
 *              below.
 */
#ifndef MQCORE_CRC32C_IMPL_H
#define MQCORE_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MQ_CRC32C_POLY 0x82F63B78u
#define MQ_CRC32C_LONG 8192
#define MQ_CRC32C_SHORT 256

/* mq_crc32c_table[k][b]: raw CRC of byte b followed by k zero bytes. */
static uint32_t mq_crc32c_table[8][256];
/* Shift tables: [k][b] is shift_B applied to b << 8k. */
static uint32_t mq_crc32c_long_shift[4][256];
static uint32_t mq_crc32c_short_shift[4][256];

/* Little-endian loads: a single load on little-endian CPUs, byte assembly on the others. */
static inline uint32_t mq_crc32c_le32(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
#endif
}

static inline uint64_t mq_crc32c_le64(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return (uint64_t)mq_crc32c_le32(p) | ((uint64_t)mq_crc32c_le32(p + 4) << 32);
#endif
}

/* Slice-by-8 software CRC over the raw register. */
static inline uint32_t mq_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo = crc ^ mq_crc32c_le32(p);
        uint32_t hi = mq_crc32c_le32(p + 4);
        crc = mq_crc32c_table[7][lo & 0xff] ^ mq_crc32c_table[6][(lo >> 8) & 0xff] ^
              mq_crc32c_table[5][(lo >> 16) & 0xff] ^ mq_crc32c_table[4][lo >> 24] ^
              mq_crc32c_table[3][hi & 0xff] ^ mq_crc32c_table[2][(hi >> 8) & 0xff] ^
              mq_crc32c_table[1][(hi >> 16) & 0xff] ^ mq_crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = mq_crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* a * b mod P, both reflected (bit 31 is the coefficient of x^0). */
static inline uint32_t mq_crc32c_gf2_mul(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    uint32_t bit;
    for (bit = 0x80000000u; bit; bit >>= 1) {
        if (a & bit)
            product ^= b;
        b = (b >> 1) ^ (MQ_CRC32C_POLY & (0u - (b & 1u)));
    }
    return product;
}

/* x^e mod P, reflected; e counts bits, so it need not be a whole number of bytes. */
static inline uint32_t mq_crc32c_xpow(size_t e)
{
    uint32_t result = 0x80000000u; /* x^0 */
    uint32_t power = 0x40000000u;  /* x^1 */
    while (e) {
        if (e & 1)
            result = mq_crc32c_gf2_mul(result, power);
        power = mq_crc32c_gf2_mul(power, power);
        e >>= 1;
    }
    return result;
}

static inline void mq_crc32c_fill_shift(uint32_t table[4][256], size_t n)
{
    uint32_t factor = mq_crc32c_xpow(8 * n); /* appending n zero bytes */
    uint32_t k, b;
    for (k = 0; k < 4; k++)
        for (b = 0; b < 256; b++)
            table[k][b] = mq_crc32c_gf2_mul(b << (8 * k), factor);
}

/* Raw CRC of (bytes with raw CRC `crc`) followed by the table's number of zero bytes. */
static inline uint32_t mq_crc32c_shift(uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

static inline void mq_crc32c_init_tables(void)
{
    uint32_t b, c;
    int k;
    for (b = 0; b < 256; b++) {
        c = b;
        for (k = 0; k < 8; k++)
            c = (c >> 1) ^ (MQ_CRC32C_POLY & (0u - (c & 1u)));
        mq_crc32c_table[0][b] = c;
    }
    for (b = 0; b < 256; b++) {
        c = mq_crc32c_table[0][b];
        for (k = 1; k < 8; k++) {
            c = mq_crc32c_table[0][c & 0xff] ^ (c >> 8);
            mq_crc32c_table[k][b] = c;
        }
    }
    mq_crc32c_fill_shift(mq_crc32c_long_shift, MQ_CRC32C_LONG);
    mq_crc32c_fill_shift(mq_crc32c_short_shift, MQ_CRC32C_SHORT);
}

/*
 * Per architecture: MQ_CRC32C_HW_TARGET (function attribute enabling the instruction),
 * MQ_CRC32C_HW_NAME, the register type the instruction chains through (64-bit on x86_64, so no
 * zero-extension sits in the dependency chain), one 8-byte and one 1-byte step, and run-time
 * detection.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <nmmintrin.h>

#define MQ_CRC32C_HW_TARGET __attribute__((target("sse4.2")))
#define MQ_CRC32C_HW_NAME "sse4.2"

typedef uint64_t mq_crc32c_reg;

static inline MQ_CRC32C_HW_TARGET mq_crc32c_reg mq_crc32c_hw_word(mq_crc32c_reg crc,
                                                                  const unsigned char *p)
{
    return _mm_crc32_u64(crc, mq_crc32c_le64(p));
}

static inline MQ_CRC32C_HW_TARGET mq_crc32c_reg mq_crc32c_hw_byte(mq_crc32c_reg crc,
                                                                  unsigned char b)
{
    return _mm_crc32_u8((uint32_t)crc, b);
}

static inline int mq_crc32c_hw_detect(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
}

#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))

#if defined(__linux__) && !defined(__ARM_FEATURE_CRC32)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

#define MQ_CRC32C_HW_NAME "armv8-crc"

#if defined(__clang__)
/* clang's arm_acle.h only declares __crc32c* when the whole build targets CRC; the builtins
   behind them work in any function compiled for "crc". */
#define MQ_CRC32C_HW_TARGET __attribute__((target("crc")))
#define MQ_CRC32C_ARM_CD(crc, v) __builtin_arm_crc32cd((crc), (v))
#define MQ_CRC32C_ARM_CB(crc, b) __builtin_arm_crc32cb((crc), (b))
#else
#include <arm_acle.h>
#define MQ_CRC32C_HW_TARGET __attribute__((target("+crc")))
#define MQ_CRC32C_ARM_CD(crc, v) __crc32cd((crc), (v))
#define MQ_CRC32C_ARM_CB(crc, b) __crc32cb((crc), (b))
#endif

typedef uint32_t mq_crc32c_reg;

static inline MQ_CRC32C_HW_TARGET mq_crc32c_reg mq_crc32c_hw_word(mq_crc32c_reg crc,
                                                                  const unsigned char *p)
{
    return MQ_CRC32C_ARM_CD(crc, mq_crc32c_le64(p));
}

static inline MQ_CRC32C_HW_TARGET mq_crc32c_reg mq_crc32c_hw_byte(mq_crc32c_reg crc,
                                                                  unsigned char b)
{
    return MQ_CRC32C_ARM_CB(crc, b);
}

static inline int mq_crc32c_hw_detect(void)
{
#if defined(__APPLE__) || defined(__ARM_FEATURE_CRC32)
    return 1;
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
    return 0;
#endif
}

#endif

#ifdef MQ_CRC32C_HW_TARGET

/* One round over 3 * block bytes at p: three chains, joined with the block's shift table. */
static inline MQ_CRC32C_HW_TARGET mq_crc32c_reg mq_crc32c_hw_3way(mq_crc32c_reg crc,
                                                                  const unsigned char *p,
                                                                  size_t block,
                                                                  uint32_t shift[4][256])
{
    mq_crc32c_reg crc1 = 0, crc2 = 0;
    const unsigned char *end = p + block;
    do {
        crc = mq_crc32c_hw_word(crc, p);
        crc1 = mq_crc32c_hw_word(crc1, p + block);
        crc2 = mq_crc32c_hw_word(crc2, p + 2 * block);
        /* Ties the chains into one statement so GCC's loop distribution (-O3) cannot split
           the loop into three sequential single-chain loops. Emits no instruction. */
        __asm__("" : "+r"(crc), "+r"(crc1), "+r"(crc2));
        p += 8;
    } while (p < end);
    crc = mq_crc32c_shift(shift, (uint32_t)crc) ^ crc1;
    return mq_crc32c_shift(shift, (uint32_t)crc) ^ crc2;
}

/* Hardware CRC over the raw register: 3-way rounds while they fit, then a single chain. */
static inline MQ_CRC32C_HW_TARGET uint32_t mq_crc32c_hw(uint32_t crc32, const unsigned char *p,
                                                         size_t n)
{
    mq_crc32c_reg crc = crc32;
    if (n >= 3 * MQ_CRC32C_SHORT) {
        while ((uintptr_t)p & 7) {
            crc = mq_crc32c_hw_byte(crc, *p++);
            n--;
        }
        while (n >= 3 * MQ_CRC32C_LONG) {
            crc = mq_crc32c_hw_3way(crc, p, MQ_CRC32C_LONG, mq_crc32c_long_shift);
            p += 3 * MQ_CRC32C_LONG;
            n -= 3 * MQ_CRC32C_LONG;
        }
        while (n >= 3 * MQ_CRC32C_SHORT) {
            crc = mq_crc32c_hw_3way(crc, p, MQ_CRC32C_SHORT, mq_crc32c_short_shift);
            p += 3 * MQ_CRC32C_SHORT;
            n -= 3 * MQ_CRC32C_SHORT;
        }
    }
    while (n >= 8) {
        crc = mq_crc32c_hw_word(crc, p);
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = mq_crc32c_hw_byte(crc, *p++);
    return (uint32_t)crc;
}

#endif

/*
 * Folding (x86_64 with AVX2 + VPCLMULQDQ). A block of MQ_CRC32C_FOLD_BLOCK bytes is split in a
 * region F of 128 * M bytes, reduced with carry-less multiplications, followed by three CRC32
 * chains of 48 * M bytes; one loop does 128 bytes of F and six words of each chain per step, so
 * both units stay busy.
 *
 * F is held in eight 16-byte lanes (four 256-bit registers). Loaded little-endian, bit j of a
 * lane's low qword is the coefficient of x^(63-j) of that qword (reflected order); clmul of two
 * such qwords yields, read as a 128-bit lane, x * A(x) * K(x). So a lane 16 + D bytes before its
 * destination lane is moved there, CRC unchanged mod P, by
 *     dest ^= clmul(lo, k_lo) ^ clmul(hi, k_hi),  k_lo = x^(8D+63) mod P,  k_hi = x^(8D-1) mod P
 * (the low qword sits D + 8 bytes further from the end of the destination than the high one,
 * the -1 takes back the x of the product), each remainder stored reflected in bits 32..63.
 * The steps fold every lane forward by 128 bytes; the end folds the eight lanes into the last
 * (distances 64, then 48, 32, 16). The CRC32 instruction over that last lane's 16 bytes from 0
 * is then F's raw CRC: the leading bytes it replaced are zeros, which leave a zero register as
 * it is, and the starting CRC was XORed into F's first four bytes, which is what a starting
 * register does. The chains are joined as in the 3-way rounds.
 */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) ||                     \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9))
#define MQ_CRC32C_HAVE_FOLD 1
#include <cpuid.h>
#include <immintrin.h>

#define MQ_CRC32C_FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq")))
#define MQ_CRC32C_FOLD_STEPS 60                              /* M */
#define MQ_CRC32C_FOLD_CHAIN (48 * MQ_CRC32C_FOLD_STEPS)     /* 2880 bytes a chain */
#define MQ_CRC32C_FOLD_BLOCK (272 * MQ_CRC32C_FOLD_STEPS)    /* 16320 bytes a block */

static uint32_t mq_crc32c_fold_shift[4][256];
/* {k_lo, k_hi} per fold distance D: 128, 64, 48, 32, 16 */
static uint64_t mq_crc32c_fold_k[5][2];

static inline void mq_crc32c_fold_init(void)
{
    static const size_t distance[5] = {128, 64, 48, 32, 16};
    int i;
    for (i = 0; i < 5; i++) {
        mq_crc32c_fold_k[i][0] = (uint64_t)mq_crc32c_xpow(8 * distance[i] + 63) << 32;
        mq_crc32c_fold_k[i][1] = (uint64_t)mq_crc32c_xpow(8 * distance[i] - 1) << 32;
    }
    mq_crc32c_fill_shift(mq_crc32c_fold_shift, MQ_CRC32C_FOLD_CHAIN);
}

/* VPCLMULQDQ is CPUID leaf 7, ECX bit 10, read directly: not every compiler's
   __builtin_cpu_supports knows its name. "avx2" there also checks that the OS saves the YMM
   registers. */
static inline int mq_crc32c_fold_detect(void)
{
    unsigned int eax, ebx, ecx, edx;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2") || !__builtin_cpu_supports("pclmul") ||
        !__builtin_cpu_supports("avx2"))
        return 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ecx >> 10) & 1;
}

static inline MQ_CRC32C_FOLD_TARGET __m128i mq_crc32c_fold16(__m128i lane, int k)
{
    const __m128i kk = _mm_loadu_si128((const __m128i *)mq_crc32c_fold_k[k]);
    return _mm_xor_si128(_mm_clmulepi64_si128(lane, kk, 0x00), _mm_clmulepi64_si128(lane, kk, 0x11));
}

static inline MQ_CRC32C_FOLD_TARGET __m256i mq_crc32c_fold32(__m256i lanes, __m256i k,
                                                             const unsigned char *next)
{
    return _mm256_xor_si256(
        _mm256_xor_si256(_mm256_clmulepi64_epi128(lanes, k, 0x00),
                         _mm256_clmulepi64_epi128(lanes, k, 0x11)),
        _mm256_loadu_si256((const __m256i *)next));
}

/* Raw CRC of one MQ_CRC32C_FOLD_BLOCK block at p, continuing from the raw CRC `crc`. */
static inline MQ_CRC32C_FOLD_TARGET uint32_t mq_crc32c_fold_block(uint32_t crc,
                                                                   const unsigned char *p)
{
    const __m256i k128 = _mm256_set_epi64x(
        (long long)mq_crc32c_fold_k[0][1], (long long)mq_crc32c_fold_k[0][0],
        (long long)mq_crc32c_fold_k[0][1], (long long)mq_crc32c_fold_k[0][0]);
    const unsigned char *chain = p + 128 * MQ_CRC32C_FOLD_STEPS;
    uint64_t c0 = 0, c1 = 0, c2 = 0;
    __m256i y0, y1, y2, y3;
    __m128i x[8];
    int i, w;
    y0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p),
                          _mm256_castsi128_si256(_mm_cvtsi32_si128((int)crc)));
    y1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    y2 = _mm256_loadu_si256((const __m256i *)(p + 64));
    y3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    for (i = 0; i < MQ_CRC32C_FOLD_STEPS; i++) {
        const unsigned char *f = p + 128 * i, *q = chain + 48 * i;
        if (i) {
            y0 = mq_crc32c_fold32(y0, k128, f);
            y1 = mq_crc32c_fold32(y1, k128, f + 32);
            y2 = mq_crc32c_fold32(y2, k128, f + 64);
            y3 = mq_crc32c_fold32(y3, k128, f + 96);
        }
        for (w = 0; w < 48; w += 8) {
            c0 = _mm_crc32_u64(c0, mq_crc32c_le64(q + w));
            c1 = _mm_crc32_u64(c1, mq_crc32c_le64(q + MQ_CRC32C_FOLD_CHAIN + w));
            c2 = _mm_crc32_u64(c2, mq_crc32c_le64(q + 2 * MQ_CRC32C_FOLD_CHAIN + w));
        }
    }
    x[0] = _mm256_castsi256_si128(y0);
    x[1] = _mm256_extracti128_si256(y0, 1);
    x[2] = _mm256_castsi256_si128(y1);
    x[3] = _mm256_extracti128_si256(y1, 1);
    x[4] = _mm256_castsi256_si128(y2);
    x[5] = _mm256_extracti128_si256(y2, 1);
    x[6] = _mm256_castsi256_si128(y3);
    x[7] = _mm256_extracti128_si256(y3, 1);
    for (i = 0; i < 4; i++) /* lanes 0-3 onto 4-7: 64 bytes apart */
        x[i + 4] = _mm_xor_si128(x[i + 4], mq_crc32c_fold16(x[i], 1));
    x[7] = _mm_xor_si128(x[7], mq_crc32c_fold16(x[4], 2));
    x[7] = _mm_xor_si128(x[7], mq_crc32c_fold16(x[5], 3));
    x[7] = _mm_xor_si128(x[7], mq_crc32c_fold16(x[6], 4));
    crc = (uint32_t)_mm_crc32_u64(_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x[7])),
                                  (uint64_t)_mm_extract_epi64(x[7], 1));
    crc = mq_crc32c_shift(mq_crc32c_fold_shift, crc) ^ (uint32_t)c0;
    crc = mq_crc32c_shift(mq_crc32c_fold_shift, crc) ^ (uint32_t)c1;
    return mq_crc32c_shift(mq_crc32c_fold_shift, crc) ^ (uint32_t)c2;
}

/* Whole blocks folded, the rest by the 3-way rounds and a single chain. */
static inline MQ_CRC32C_FOLD_TARGET uint32_t mq_crc32c_fold(uint32_t crc, const unsigned char *p,
                                                            size_t n)
{
    while (n >= MQ_CRC32C_FOLD_BLOCK) {
        crc = mq_crc32c_fold_block(crc, p);
        p += MQ_CRC32C_FOLD_BLOCK;
        n -= MQ_CRC32C_FOLD_BLOCK;
    }
    return mq_crc32c_hw(crc, p, n);
}
#endif

typedef uint32_t (*mq_crc32c_fn)(uint32_t crc, const unsigned char *p, size_t n);

static inline uint32_t mq_crc32c_first_call(uint32_t crc, const unsigned char *p, size_t n);

/* The chosen implementation; mq_crc32c_first_call until mq_crc32c_init has run. */
static mq_crc32c_fn mq_crc32c_impl = mq_crc32c_first_call;
static const char *mq_crc32c_impl_name = "software";

/* Build the tables and pick the implementation. Idempotent; call it once, before other
   threads can reach the kernel (crc32c.pyx does so at import, holding the GIL). The environment
   variable MQCORE_CRC32C ("software", or the name of a plain hardware kernel) picks a slower
   kernel instead, so tests and benchmarks can run each one the machine has. */
static inline void mq_crc32c_init(void)
{
    mq_crc32c_fn chosen = mq_crc32c_sw;
    const char *forced;
    if (mq_crc32c_impl != mq_crc32c_first_call)
        return;
    mq_crc32c_init_tables();
#ifdef MQ_CRC32C_HW_TARGET
    if (mq_crc32c_hw_detect()) {
        chosen = mq_crc32c_hw;
        mq_crc32c_impl_name = MQ_CRC32C_HW_NAME;
    }
#endif
#ifdef MQ_CRC32C_HAVE_FOLD
    if (mq_crc32c_fold_detect()) {
        mq_crc32c_fold_init();
        chosen = mq_crc32c_fold;
        mq_crc32c_impl_name = "sse4.2+vpclmulqdq";
    }
#endif
    forced = getenv("MQCORE_CRC32C");
    if (forced != NULL && strcmp(forced, "software") == 0) {
        chosen = mq_crc32c_sw;
        mq_crc32c_impl_name = "software";
    }
#ifdef MQ_CRC32C_HW_TARGET
    else if (forced != NULL && strcmp(forced, MQ_CRC32C_HW_NAME) == 0 && mq_crc32c_hw_detect()) {
        chosen = mq_crc32c_hw;
        mq_crc32c_impl_name = MQ_CRC32C_HW_NAME;
    }
#endif
    mq_crc32c_impl = chosen;
}

/* Safety net for a caller that skipped mq_crc32c_init. */
static inline uint32_t mq_crc32c_first_call(uint32_t crc, const unsigned char *p, size_t n)
{
    mq_crc32c_init();
    return mq_crc32c_impl(crc, p, n);
}

/* CRC-32C of p[0:n] continuing from the finished CRC `crc` (0 to start), best implementation. */
static inline uint32_t mq_crc32c_extend(uint32_t crc, const unsigned char *p, size_t n)
{
    return ~mq_crc32c_impl(~crc, p, n);
}

/* Same as mq_crc32c_extend, always with the software tables. */
static inline uint32_t mq_crc32c_extend_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    mq_crc32c_init();
    return ~mq_crc32c_sw(~crc, p, n);
}

/* "sse4.2", "armv8-crc" or "software". */
static inline const char *mq_crc32c_implementation(void)
{
    mq_crc32c_init();
    return mq_crc32c_impl_name;
}

static inline int mq_crc32c_hardware_accelerated(void)
{
    mq_crc32c_init();
    return mq_crc32c_impl != mq_crc32c_sw;
}

#endif
