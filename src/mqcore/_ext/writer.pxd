# A background pwrite() thread that appends overlap with encoding (writer_impl.h).
from libc.stdint cimport int64_t

cdef extern from "writer_impl.h" nogil:
    ctypedef struct mq_writer:
        pass
    void mq_writer_init(mq_writer* w)
    int mq_writer_ready(mq_writer* w)
    void mq_writer_submit(mq_writer* w, int fd, const char* data, size_t n, int64_t position)
    int mq_writer_drain(mq_writer* w)
    void mq_writer_stop(mq_writer* w)


cdef class BackgroundWriter:
    cdef mq_writer w
    # Start the thread if this process has none (first use, or after fork); OSError on failure.
    cdef int ready(self) except -1
    # Queue data[0:n] for position `position` of fd; the caller keeps data alive until drain().
    cdef void submit(self, int fd, const char* data, size_t n, int64_t position) noexcept nogil
    # Wait for every queued write; OSError with the first failure's errno.
    cdef int drain(self) except -1
    # Same, for cleanup paths that are already raising: the error is dropped.
    cdef void drain_quietly(self) noexcept
