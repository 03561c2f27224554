"""Hot kernels over raw buffers (Cython). Only `mqcore`'s storage and records layers import these."""
