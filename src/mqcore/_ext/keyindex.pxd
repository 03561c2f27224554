# The per-segment key index and tag column (keyindex.pyx); nothing is cimported from it yet.
