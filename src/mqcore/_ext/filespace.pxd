# Disk space reserved ahead of a segment's end; nothing to cimport: one Python-level call.
