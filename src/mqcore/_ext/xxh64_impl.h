/* XXH64 (xxHash, 64-bit variant), written from its published specification: four 64-bit lanes
 * over 32-byte stripes, a merge, then the 8/4/1-byte tail and the final avalanche. Inputs are
 * read little-endian, as the specification defines, whatever the host order. */
#ifndef MQCORE_XXH64_IMPL_H
#define MQCORE_XXH64_IMPL_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define MQ_XXH_P1 0x9E3779B185EBCA87ULL
#define MQ_XXH_P2 0xC2B2AE3D27D4EB4FULL
#define MQ_XXH_P3 0x165667B19E3779F9ULL
#define MQ_XXH_P4 0x85EBCA77C2B2AE63ULL
#define MQ_XXH_P5 0x27D4EB2F165667C5ULL

static inline uint64_t mq_xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t mq_xxh_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t mq_xxh_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t mq_xxh_round(uint64_t acc, uint64_t input) {
    acc += input * MQ_XXH_P2;
    acc = mq_xxh_rotl(acc, 31);
    return acc * MQ_XXH_P1;
}

static inline uint64_t mq_xxh_merge(uint64_t acc, uint64_t lane) {
    acc ^= mq_xxh_round(0, lane);
    return acc * MQ_XXH_P1 + MQ_XXH_P4;
}

static inline uint64_t mq_xxh64(const void *data, size_t len, uint64_t seed) {
    const unsigned char *p = (const unsigned char *)data;
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + MQ_XXH_P1 + MQ_XXH_P2, v2 = seed + MQ_XXH_P2;
        uint64_t v3 = seed, v4 = seed - MQ_XXH_P1;
        const unsigned char *limit = end - 32;
        do {
            v1 = mq_xxh_round(v1, mq_xxh_le64(p));
            v2 = mq_xxh_round(v2, mq_xxh_le64(p + 8));
            v3 = mq_xxh_round(v3, mq_xxh_le64(p + 16));
            v4 = mq_xxh_round(v4, mq_xxh_le64(p + 24));
            p += 32;
        } while (p <= limit);
        h = mq_xxh_rotl(v1, 1) + mq_xxh_rotl(v2, 7) + mq_xxh_rotl(v3, 12) + mq_xxh_rotl(v4, 18);
        h = mq_xxh_merge(h, v1);
        h = mq_xxh_merge(h, v2);
        h = mq_xxh_merge(h, v3);
        h = mq_xxh_merge(h, v4);
    } else {
        h = seed + MQ_XXH_P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= mq_xxh_round(0, mq_xxh_le64(p));
        h = mq_xxh_rotl(h, 27) * MQ_XXH_P1 + MQ_XXH_P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)mq_xxh_le32(p) * MQ_XXH_P1;
        h = mq_xxh_rotl(h, 23) * MQ_XXH_P2 + MQ_XXH_P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * MQ_XXH_P5;
        h = mq_xxh_rotl(h, 11) * MQ_XXH_P1;
        p++;
    }
    h ^= h >> 33;
    h *= MQ_XXH_P2;
    h ^= h >> 29;
    h *= MQ_XXH_P3;
    h ^= h >> 32;
    return h;
}
#endif
