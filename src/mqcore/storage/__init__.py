"""Storage layer: segments, partitions and the store directory (files on disk, no public API)."""
