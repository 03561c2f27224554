"""Hot kernels over raw buffers (Cython); only mqcore's storage and records layers import them."""
