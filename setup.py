"""Build the compiled scope core; everything else is in pyproject.toml.

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

    setup(
        ext_modules=cythonize(
            [Extension("sessionscope._core", ["src/sessionscope/_core.pyx"])],
            compiler_directives={"language_level": "3", "embedsignature": True},
        )
    )
