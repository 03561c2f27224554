# A background pwrite() worker for streamed appends (batch.pyx "Streaming"; writer_impl.h).
#
# One POSIX thread per BackgroundWriter writes queued (buffer, length, position) jobs in order.
# The thread exists only while the object lives; close() (or deallocation) finishes the queued
# jobs and joins it. A writer is used by one append at a time (the partition lock), so there is
# never more than one submitter.


cdef class BackgroundWriter:
    """A pwrite() thread; appends queue the chunks of a batch on it while encoding the next."""

    def __cinit__(self):
        mq_writer_init(&self.w)

    def __dealloc__(self):
        with nogil:
            mq_writer_stop(&self.w)

    cdef int ready(self) except -1:
        cdef int err = mq_writer_ready(&self.w)
        if err:
            import os
            raise OSError(err, f"cannot start the background writer thread: {os.strerror(err)}")
        return 0

    cdef void submit(self, int fd, const char* data, size_t n, int64_t position) noexcept nogil:
        mq_writer_submit(&self.w, fd, data, n, position)

    cdef int drain(self) except -1:
        cdef int err
        with nogil:
            err = mq_writer_drain(&self.w)
        if err:
            import os
            raise OSError(err, os.strerror(err))
        return 0

    cdef void drain_quietly(self) noexcept:
        with nogil:
            mq_writer_drain(&self.w)

    def close(self):
        """Finish the queued writes and stop the thread (it restarts on the next use)."""
        with nogil:
            mq_writer_stop(&self.w)
