"""Build the compiled scope core and hot path; everything else is in pyproject.toml.

The hot-path modules are annotated Python (Cython's pure-Python mode): each
is compiled a second time under its own name with a ``_c`` suffix, so the
source stays importable as the pure-Python twin beside its compiled build.

SESSIONSCOPE_NO_EXTENSIONS=1 builds the pure-Python package on purpose. Without
it a missing compiler or Cython fails the build loudly: the pure twin is never a
silent fallback.
"""

import os
import platform

from setuptools import Extension, setup

PURE_BUILD = (
    os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")
    or platform.python_implementation() != "CPython"
)

if PURE_BUILD:
    setup(ext_modules=[])
else:
    from Cython.Build import cythonize

    # (compiled module, source): sessionscope.core.compiled_or_twin picks them.
    HOT_PATH = [
        ("sessionscope.stores.lmdb._append_c", "src/sessionscope/stores/lmdb/_append.py"),
        ("sessionscope.stores.lmdb._locks_c", "src/sessionscope/stores/lmdb/_locks.py"),
        ("sessionscope.stores.lmdb.layout_c", "src/sessionscope/stores/lmdb/layout.py"),
        ("sessionscope.service._append_c", "src/sessionscope/service/_append.py"),
        ("sessionscope.service._listing_c", "src/sessionscope/service/_listing.py"),
        ("sessionscope.crypto.envelope_c", "src/sessionscope/crypto/envelope.py"),
    ]
    setup(
        ext_modules=cythonize(
            [
                Extension("sessionscope._speedups._core", ["src/sessionscope/_speedups/_core.pyx"]),
                *(Extension(name, [source]) for name, source in HOT_PATH),
            ],
            compiler_directives={"language_level": "3", "embedsignature": True},
        ),
        # The modules are compiled at once, one a CPU: each is a large
        # generated C file, and compiling them one after another took most
        # of an install's time.
        options={"build_ext": {"parallel": True}},
    )
