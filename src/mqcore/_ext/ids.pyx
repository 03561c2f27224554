# Message IDs (docs/format.md "Message IDs"; query/ids.py is their Python face): the store ID's
# text both ways and the text of a unique ID, for Message.msg_id / unique_id (batch.pyx), the
# store-ID lookup (lookup.pyx) and query/ids.py, which all use these: one copy of each rule.
#
# Store ID: "m1-" + unpadded base64url (RFC 4648 section 5) of
#   varint partition | varint offset | topic (UTF-8)
# with Kafka's zigzag varints (varint.pxd). decode_store_id accepts exactly the canonical IDs
# (the body re-encodes to itself, each varint is its shortest form, the topic is a legal name)
# and returns None for every other text, which ids.decode_msg_id then explains.
# Unique ID: 16 bytes (a UUIDv7 when mqcore assigns it: encode.pxi) written as a canonical UUID,
# 8-4-4-4-12 lowercase hex digits.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_DecodeASCII
from libc.stdint cimport INT32_MAX, int64_t
from libc.string cimport memcmp, memcpy

from mqcore._ext.varint cimport MAX_VARINT_BYTES, read_varint, write_varint

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL

cdef enum:
    MAX_ID_BODY = 512             # base64 characters of the longest store ID the fast path takes
    MAX_ID_RAW = 384              # the bytes they decode to
    MAX_TOPIC_LENGTH = 249        # config.MAX_NAME_LENGTH
    UID_BYTES = 16
    ID_RAW_ROOM = 2 * MAX_VARINT_BYTES + MAX_TOPIC_LENGTH  # the bytes of a store ID's body

STORE_ID_PREFIX = "m1-"

cdef const char* B64URL_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
cdef const char* HEX_DIGITS = b"0123456789abcdef"


cdef signed char B64URL[256]


cdef void init_alphabet() noexcept nogil:
    cdef int i
    for i in range(256):
        B64URL[i] = -1
    for i in range(64):
        B64URL[<unsigned char>B64URL_CHARS[i]] = i


init_alphabet()


cdef inline bint legal_name_char(unsigned char c) noexcept nogil:
    return (c >= 97 and c <= 122) or (c >= 65 and c <= 90) or (c >= 48 and c <= 57) \
        or c == 46 or c == 95 or c == 45


cdef Py_ssize_t unbase64(const unsigned char* s, Py_ssize_t n, unsigned char* out) noexcept nogil:
    """Decode unpadded base64url s[:n] into out; -1 unless it is the canonical encoding of the
    bytes (every character in the alphabet, no lone last character, unused low bits zero)."""
    cdef Py_ssize_t i, o = 0, full = n - n % 4
    cdef int a, b, c, d
    if n % 4 == 1:
        return -1
    for i in range(n):
        if B64URL[s[i]] < 0:
            return -1
    i = 0
    while i < full:
        a, b, c, d = B64URL[s[i]], B64URL[s[i + 1]], B64URL[s[i + 2]], B64URL[s[i + 3]]
        out[o] = <unsigned char>((a << 2) | (b >> 4))
        out[o + 1] = <unsigned char>(((b & 15) << 4) | (c >> 2))
        out[o + 2] = <unsigned char>(((c & 3) << 6) | d)
        o += 3
        i += 4
    if n - full == 2:
        a, b = B64URL[s[i]], B64URL[s[i + 1]]
        if b & 15:
            return -1
        out[o] = <unsigned char>((a << 2) | (b >> 4))
        o += 1
    elif n - full == 3:
        a, b, c = B64URL[s[i]], B64URL[s[i + 1]], B64URL[s[i + 2]]
        if c & 3:
            return -1
        out[o] = <unsigned char>((a << 2) | (b >> 4))
        out[o + 1] = <unsigned char>(((b & 15) << 4) | (c >> 2))
        o += 2
    return o


cdef bint canonical_varint(const unsigned char* p, int n, int64_t value) noexcept nogil:
    """Whether p[:n] is the shortest encoding of value (decoding drops bits past 64)."""
    cdef unsigned char buf[MAX_VARINT_BYTES]
    return write_varint(buf, value) == n and memcmp(buf, p, n) == 0


cdef object decode_id(object text):
    """(topic, partition, offset) of a canonical store ID, else None."""
    cdef const unsigned char* s
    cdef Py_ssize_t n, rn, tl, i
    cdef unsigned char raw[MAX_ID_RAW]
    cdef int64_t partition, offset
    cdef int n1, n2
    if not PyUnicode_CheckExact(text) or not PyUnicode_IS_ASCII(text):
        return None
    s = <const unsigned char*>PyUnicode_AsUTF8AndSize(text, &n)
    if n < 3 or s[0] != 109 or s[1] != 49 or s[2] != 45:  # "m1-"
        return None
    if n - 3 > MAX_ID_BODY:
        return None
    rn = unbase64(s + 3, n - 3, raw)
    if rn < 0:
        return None
    n1 = read_varint(raw, rn, &partition)
    if n1 < 0:
        return None
    n2 = read_varint(raw + n1, rn - n1, &offset)
    if n2 < 0:
        return None
    if partition < 0 or partition > INT32_MAX or offset < 0:
        return None
    if not canonical_varint(raw, n1, partition) or not canonical_varint(raw + n1, n2, offset):
        return None
    tl = rn - n1 - n2
    if tl < 1 or tl > MAX_TOPIC_LENGTH:
        return None
    for i in range(n1 + n2, rn):
        if not legal_name_char(raw[i]):
            return None
    if raw[n1 + n2] == 46 and (tl == 1 or (tl == 2 and raw[n1 + n2 + 1] == 46)):
        return None  # "." and ".." are no topic names
    return (PyUnicode_DecodeASCII(<char*>raw + n1 + n2, tl, NULL), partition, offset)


def decode_store_id(text):
    """(topic, partition, offset) of a store ID in canonical form, or None for any other text
    (ids.decode_msg_id then says what is wrong with it)."""
    return decode_id(text)


cdef Py_ssize_t base64(const unsigned char* s, Py_ssize_t n, char* out) noexcept nogil:
    """Unpadded base64url of s[:n] into out (room for (n * 4 + 2) // 3 characters); returns
    how many were written."""
    cdef Py_ssize_t i = 0, o = 0
    cdef unsigned int v
    while i + 3 <= n:
        v = (<unsigned int>s[i] << 16) | (<unsigned int>s[i + 1] << 8) | s[i + 2]
        out[o] = B64URL_CHARS[v >> 18]
        out[o + 1] = B64URL_CHARS[(v >> 12) & 63]
        out[o + 2] = B64URL_CHARS[(v >> 6) & 63]
        out[o + 3] = B64URL_CHARS[v & 63]
        o += 4
        i += 3
    if n - i == 1:
        v = <unsigned int>s[i] << 16
        out[o] = B64URL_CHARS[v >> 18]
        out[o + 1] = B64URL_CHARS[(v >> 12) & 63]
        o += 2
    elif n - i == 2:
        v = (<unsigned int>s[i] << 16) | (<unsigned int>s[i + 1] << 8)
        out[o] = B64URL_CHARS[v >> 18]
        out[o + 1] = B64URL_CHARS[(v >> 12) & 63]
        out[o + 2] = B64URL_CHARS[(v >> 6) & 63]
        o += 3
    return o


cdef str encode_id(str topic, int64_t partition, int64_t offset):
    """The store ID of the message at (topic, partition, offset)."""
    cdef Py_ssize_t tl, rn, n
    cdef const char* t = PyUnicode_AsUTF8AndSize(topic, &tl)
    cdef unsigned char raw_here[ID_RAW_ROOM]
    cdef char text_here[3 + 2 * ID_RAW_ROOM]  # base64 takes 4/3 of the bytes: room to spare
    cdef unsigned char* raw = raw_here
    cdef char* text = text_here
    cdef void* block = NULL
    cdef Py_ssize_t raw_room = 2 * MAX_VARINT_BYTES + tl
    if tl > MAX_TOPIC_LENGTH:  # not a topic name mqcore accepts, yet it has an ID
        block = PyMem_Malloc(raw_room + 3 + 2 * raw_room)
        if block == NULL:
            raise MemoryError()
        raw = <unsigned char*>block
        text = <char*>block + raw_room
    try:
        rn = write_varint(raw, partition)
        rn += write_varint(raw + rn, offset)
        memcpy(raw + rn, t, tl)
        rn += tl
        memcpy(text, b"m1-", 3)
        n = 3 + base64(raw, rn, text + 3)
        return PyUnicode_DecodeASCII(text, n, NULL)
    finally:
        PyMem_Free(block)


def encode_store_id(str topic not None, int64_t partition, int64_t offset):
    """The store ID of the message at (topic, partition, offset)."""
    return encode_id(topic, partition, offset)


cdef str uid_chars(const unsigned char* raw):
    """The canonical text (8-4-4-4-12 lowercase hex) of the 16 bytes at raw."""
    cdef char out[36]
    cdef int i, o = 0
    for i in range(UID_BYTES):
        if i == 4 or i == 6 or i == 8 or i == 10:
            out[o] = 45  # "-"
            o += 1
        out[o] = HEX_DIGITS[raw[i] >> 4]
        out[o + 1] = HEX_DIGITS[raw[i] & 15]
        o += 2
    return PyUnicode_DecodeASCII(out, 36, NULL)


def uid_text(const unsigned char[::1] raw not None):
    """The canonical text of a 16-byte unique ID."""
    if raw.shape[0] != UID_BYTES:
        raise ValueError(f"a unique ID is {UID_BYTES} bytes, not {raw.shape[0]}")
    return uid_chars(&raw[0])
