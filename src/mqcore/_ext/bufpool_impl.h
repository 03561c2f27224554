/* A small pool of warm heap blocks, for the kernels that fill a large buffer per call.
 *
 * A fresh multi-megabyte malloc is served by a new mmap whose pages fault in one by one on first
 * touch; for the encoder's glue buffer and the Arrow column buffers that costs as much as the
 * work done in them (bench/README.md). Each module keeps one pool: blocks given back are kept
 * (up to `slots` of them and `max_bytes` in all, each between `min_block` and `max_block`) and
 * a later take gets the smallest that is large enough. A full pool evicts its smallest blocks
 * for a larger one, so a run of small requests cannot crowd out the large blocks that matter.
 *
 * Not thread-safe by itself: every caller holds the GIL around take and give.
 */
#ifndef MQCORE_BUFPOOL_IMPL_H
#define MQCORE_BUFPOOL_IMPL_H

#include <stddef.h>
#include <stdlib.h>

#define MQ_POOL_MAX_SLOTS 16

typedef struct {
    char *data[MQ_POOL_MAX_SLOTS];
    size_t cap[MQ_POOL_MAX_SLOTS];
    int n;
    int slots;        /* at most MQ_POOL_MAX_SLOTS */
    size_t bytes;     /* held in all */
    size_t max_bytes;
    size_t min_block;
    size_t max_block;
} mq_pool;

static void mq_pool_drop(mq_pool *p, int i)
{
    p->bytes -= p->cap[i];
    p->n--;
    p->data[i] = p->data[p->n];
    p->cap[i] = p->cap[p->n];
}

/* The smallest pooled block of at least `want` bytes (its size in *cap), or NULL. */
static char *mq_pool_take(mq_pool *p, size_t want, size_t *cap)
{
    int i, best = -1;
    char *d;
    for (i = 0; i < p->n; i++)
        if (p->cap[i] >= want && (best < 0 || p->cap[i] < p->cap[best]))
            best = i;
    if (best < 0)
        return NULL;
    d = p->data[best];
    *cap = p->cap[best];
    mq_pool_drop(p, best);
    return d;
}

/* Keep `d` (a malloc'd block of `cap` bytes) for a later take, or free it. */
static void mq_pool_give(mq_pool *p, char *d, size_t cap)
{
    int i, smallest;
    if (d == NULL)
        return;
    if (cap < p->min_block || cap > p->max_block || cap > p->max_bytes) {
        free(d);
        return;
    }
    while (p->n == p->slots || p->bytes + cap > p->max_bytes) {
        smallest = 0;
        for (i = 1; i < p->n; i++)
            if (p->cap[i] < p->cap[smallest])
                smallest = i;
        if (p->n == 0 || p->cap[smallest] >= cap) {
            free(d); /* everything kept is at least as large */
            return;
        }
        free(p->data[smallest]);
        mq_pool_drop(p, smallest);
    }
    p->data[p->n] = d;
    p->cap[p->n] = cap;
    p->bytes += cap;
    p->n++;
}

#endif
