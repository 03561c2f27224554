# Disk space reserved ahead of a segment's end (docs/format.md "Reserved space").
#
# fallocate(FALLOC_FL_KEEP_SIZE) gives the file blocks past its end without changing its size:
# readers, Kafka's tools and recovery still see exactly the bytes written, while the appends that
# land in the reserved range skip the filesystem's block allocation on every write(). Unwritten
# reserved blocks read as zeros on any filesystem that supports the call, never as stale data.
# Truncating the file to its own size hands the reserve back (segment seal, close, next open).
# Platforms or filesystems without the call report EOPNOTSUPP: the caller stops asking.

cdef extern from *:
    """
    #include <errno.h>
    #if defined(__linux__)
    #include <fcntl.h>
    #ifndef FALLOC_FL_KEEP_SIZE
    #define FALLOC_FL_KEEP_SIZE 0x01
    #endif
    static int mq_reserve(int fd, long long offset, long long length)
    {
        int rc;
        do {
            rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
        } while (rc != 0 && errno == EINTR);
        return rc == 0 ? 0 : errno;
    }
    #else
    static int mq_reserve(int fd, long long offset, long long length)
    {
        (void)fd; (void)offset; (void)length;
        return EOPNOTSUPP;
    }
    #endif
    """
    int mq_reserve(int fd, long long offset, long long length) nogil


def reserve(int fd, long long offset, long long length):
    """Reserve [offset, offset + length) of `fd` without changing its size; 0 or an errno."""
    cdef int err
    if offset < 0 or length <= 0:
        raise ValueError(f"bad range to reserve: offset {offset}, length {length}")
    with nogil:
        err = mq_reserve(fd, offset, length)
    return err
