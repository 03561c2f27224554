"""Declares the Cython extensions; all metadata lives in pyproject.toml."""

import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

# One extension per hot kernel; each has a .pxd (what others cimport) and a .pyi (typing).
KERNELS = [
    "crc32c",
    "varint",
    "ids",
    "batch",
    "encode",
    "scan",
    "search",
    "index",
    "arrowcols",
    "hashing",
    "mapping",
    "keyindex",
    "filespace",
    "segtable",
    "lookup",
    "rawbatch",
]
# Compiled modules of the layers above the kernels, by package: they may import their own
# layer and what is below it (tests/test_layers.py), as the layer's Python modules do.
LAYER_MODULES = {"query": ["keyed"]}
# MQCORE_KERNELS="crc32c varint" builds a subset (fuzz and sanitizer builds of one kernel);
# MQCORE_KERNELS=none builds none (the Makefile's editable install: it builds them in place once).
if os.environ.get("MQCORE_KERNELS"):
    wanted = os.environ["MQCORE_KERNELS"].split()
    KERNELS = [k for k in KERNELS if k in wanted]
    LAYER_MODULES = {pkg: [m for m in mods if m in wanted] for pkg, mods in LAYER_MODULES.items()}

# Directives are set here once for every module; functions that check every length they read
# turn bounds checking off locally.
DIRECTIVES = {
    "language_level": 3,
    "embedsignature": True,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
}

compile_args = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing"]
link_args = []
if os.environ.get("MQCORE_SANITIZE"):
    # `make asan`: AddressSanitizer + UndefinedBehaviorSanitizer builds of every kernel
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    compile_args += flags
    link_args += flags

extensions = [
    Extension(
        f"mqcore._ext.{name}",
        [f"src/mqcore/_ext/{name}.pyx"],
        include_dirs=["src/mqcore/_ext"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for name in KERNELS
] + [
    Extension(
        f"mqcore.{package}.{name}",
        [f"src/mqcore/{package}/{name}.pyx"],
        include_dirs=["src/mqcore/_ext"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for package, names in LAYER_MODULES.items()
    for name in names
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        include_path=["src"],
        nthreads=int(os.environ.get("MQCORE_BUILD_JOBS", "0")),
    )
)
