# C declarations of bufpool_impl.h (pools of warm heap blocks); batch.pyx (glue buffers) and
# arrowcols.pyx (Arrow column buffers) each keep one. The GIL guards every take and give.
cdef extern from "bufpool_impl.h" nogil:
    ctypedef struct mq_pool:
        int slots             # blocks kept at most (<= 16)
        size_t max_bytes      # bytes kept at most
        size_t min_block      # smaller blocks are freed, not kept
        size_t max_block      # and so are larger ones
    # The smallest kept block of at least `want` bytes (its size in cap[0]), or NULL.
    char* mq_pool_take(mq_pool* p, size_t want, size_t* cap)
    # Keep the malloc'd block `d` of `cap` bytes, evicting smaller ones if full, or free it.
    void mq_pool_give(mq_pool* p, char* d, size_t cap)
