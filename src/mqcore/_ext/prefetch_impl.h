/* Software prefetch for the point lookups: they chase a few dependent loads through large
 * mappings (a key index, a segment's batches), where each is a cache and TLB miss; touching
 * the next lines early lets those misses overlap. A no-op on compilers without the builtin. */
#ifndef MQCORE_PREFETCH_IMPL_H
#define MQCORE_PREFETCH_IMPL_H
#include <stddef.h>

#if defined(__GNUC__) || defined(__clang__)
#define mq_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)
#else
#define mq_prefetch(p) ((void)(p))
#endif

/* Every 64-byte line of [p, p + n): for a run of records a walk is about to read in order. */
static inline void mq_prefetch_range(const unsigned char *p, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i += 64) mq_prefetch(p + i);
}
#endif
