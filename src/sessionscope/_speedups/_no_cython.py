"""The few names of Cython's pure-Python mode the hot-path modules use, for a pure install.

With Cython installed, ``import cython`` finds its own shadow module; a
package installed without extensions may lack Cython, and these stand in:
the types are plain Python types, the decorators leave functions as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

compiled = False

bint = bool
int = int
longlong = int
ulonglong = int
double = float
Py_ssize_t = int
p_const_char = bytes
p_void = object
NULL = None


class p_uchar:  # named as Cython names the C type
    """A pointer to unsigned chars: only compiled code makes and uses one."""

    def __getitem__(self, index: int) -> int:
        raise TypeError("a C pointer exists in compiled code only")

    def __setitem__(self, index: int, value: int) -> None:
        raise TypeError("a C pointer exists in compiled code only")

    def __add__(self, offset: int) -> p_uchar:
        raise TypeError("a C pointer exists in compiled code only")


def declare(kind: Any, value: Any = None, **visibility: Any) -> Any:
    """Return ``value``: a declared attribute or variable is a plain Python one."""
    return value


def address(value: Any) -> Any:
    """Return ``value``: compiled, a C variable's address (only compiled code calls it)."""
    return value


def cast(kind: Any, value: Any) -> Any:
    """Return ``value``: compiled, a C cast (only compiled code calls it)."""
    return value


def boundscheck(flag: bool) -> Callable[[F], F]:
    """Return a decorator that leaves a function as it is (compiled, it sets index checks)."""
    return _unchanged


def wraparound(flag: bool) -> Callable[[F], F]:
    """Return a decorator that leaves a function as it is (compiled, it sets negative indexes)."""
    return _unchanged


def _unchanged(function: F) -> F:
    return function


def cfunc(function: F) -> F:
    """Leave a function as it is (compiled, it becomes a C function)."""
    return function


def ccall(function: F) -> F:
    """Leave a function as it is (compiled, it becomes a cpdef function)."""
    return function


def cclass(cls: C) -> C:
    """Leave a class as it is (compiled, it becomes an extension type)."""
    return cls


def no_gc(cls: C) -> C:
    """Leave a class as it is (compiled, its objects are not tracked by the garbage collector)."""
    return cls


def inline(function: F) -> F:
    """Leave a function as it is (compiled, it is inlined)."""
    return function


def final(cls: C) -> C:
    """Leave a class as it is (compiled, its methods are never overridden)."""
    return cls


class _NoGil:
    """Compiled, ``with nogil:`` releases the GIL; here it does nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


nogil = _NoGil()
