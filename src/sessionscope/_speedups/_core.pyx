# cython: language_level=3, embedsignature=True
"""Route state keys by scope prefix and validate storable values, compiled.

The hot path of every append. Behaviour, messages and exception types match
the pure-Python twin ``sessionscope._speedups._core_py`` exactly; the twin also owns the
prefix constants and the ``Scope`` enum, so both modules hand out the same
enum members.
"""

from cpython.bool cimport PyBool_Check
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.dict cimport (
    PyDict_Check,
    PyDict_CheckExact,
    PyDict_Copy,
    PyDict_Next,
    PyDict_SetItem,
    PyDict_Size,
)
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check, PyFloat_CheckExact
from cpython.list cimport PyList_Check, PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport (
    PyLong_AsLongLongAndOverflow,
    PyLong_AsUnsignedLongLong,
    PyLong_Check,
    PyLong_CheckExact,
)
from cpython.object cimport PyObject_SetItem
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_Check, PyTuple_CheckExact, PyTuple_GET_SIZE
from cpython.type cimport PyType_IsSubtype
from cpython.unicode cimport (
    PyUnicode_1BYTE_DATA,
    PyUnicode_Check,
    PyUnicode_CheckExact,
    PyUnicode_Concat,
    PyUnicode_GET_LENGTH,
    PyUnicode_New,
    PyUnicode_READ_CHAR,
    PyUnicode_Substring,
)
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    bint PyUnicode_IS_ASCII(object o)
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index)
    int PyUnicode_1BYTE_KIND


cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030C0000
    #define sessionscope_str_ready(o) PyUnicode_READY(o)
    #else
    #define sessionscope_str_ready(o) 0
    #endif
    """
    int _str_ready "sessionscope_str_ready" (object o) except -1

import msgpack

from sessionscope._speedups._core_py import (
    APP_PREFIX,
    FIELD_AS_IS,
    FIELD_REFUSED,
    FIELD_SORTED,
    KEY_PREFIX_APP,
    KEY_PREFIX_TEMP,
    KEY_PREFIX_USER,
    MAX_DEPTH,
    TEMP_PREFIX,
    USER_PREFIX,
    Scope,
)
from sessionscope.errors import StateValueError

__all__ = [
    "APP_PREFIX",
    "FIELD_AS_IS",
    "FIELD_REFUSED",
    "FIELD_SORTED",
    "KEY_PREFIX_APP",
    "KEY_PREFIX_TEMP",
    "KEY_PREFIX_USER",
    "MAX_DEPTH",
    "TEMP_PREFIX",
    "USER_PREFIX",
    "Scope",
    "apply_delta",
    "check_delta",
    "check_storable",
    "last_values",
    "merge_scopes",
    "pack_event",
    "pack_model",
    "pack_plain",
    "partition_by_scope",
    "partition_checked",
    "revision_marker",
    "scope_of",
    "sized_key",
    "sortable_time",
    "timed_record",
    "trim_temp_keys",
]

# Scope codes of the C-level helpers; the enum members are looked up once.
cdef enum:
    _SESSION = 0
    _APP = 1
    _USER = 2
    _TEMP = 3

cdef object _SCOPE_APP = Scope.APP
cdef object _SCOPE_USER = Scope.USER
cdef object _SCOPE_SESSION = Scope.SESSION
cdef object _SCOPE_TEMP = Scope.TEMP

cdef str _APP_PREFIX = APP_PREFIX
cdef str _USER_PREFIX = USER_PREFIX
cdef int _MAX_DEPTH = MAX_DEPTH

# msgpack stores integers as int64 or uint64: this is the top of the range.
cdef object _UINT64_MAX = 2**64 - 1

# A namedtuple msgpack packs as an extension, not an array (see _check_items).
cdef type _EXT_TYPE = msgpack.ExtType

if (APP_PREFIX, USER_PREFIX, TEMP_PREFIX) != ("app:", "user:", "temp:"):
    # _scope_code() spells the prefixes out character by character.
    raise ImportError("sessionscope._speedups._core is out of step with sessionscope._speedups._core_py")


cdef inline int _scope_code(object key) noexcept:
    # The key is a str. Comparing characters in place avoids building a
    # bound method and a prefix object per key, which is most of the time
    # str.startswith() takes.
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(key)
    if n < 4:
        return _SESSION
    cdef Py_UCS4 c = PyUnicode_READ_CHAR(key, 0)
    if c == u'a':
        if (
            PyUnicode_READ_CHAR(key, 1) == u'p'
            and PyUnicode_READ_CHAR(key, 2) == u'p'
            and PyUnicode_READ_CHAR(key, 3) == u':'
        ):
            return _APP
    elif c == u'u':
        if (
            n >= 5
            and PyUnicode_READ_CHAR(key, 1) == u's'
            and PyUnicode_READ_CHAR(key, 2) == u'e'
            and PyUnicode_READ_CHAR(key, 3) == u'r'
            and PyUnicode_READ_CHAR(key, 4) == u':'
        ):
            return _USER
    elif c == u't':
        if (
            n >= 5
            and PyUnicode_READ_CHAR(key, 1) == u'e'
            and PyUnicode_READ_CHAR(key, 2) == u'm'
            and PyUnicode_READ_CHAR(key, 3) == u'p'
            and PyUnicode_READ_CHAR(key, 4) == u':'
        ):
            return _TEMP
    return _SESSION


cdef inline bint _is_str(object key) except -1:
    # Before 3.12 a str built through the legacy Py_UNICODE API must be made
    # ready before its characters are read in place.
    if PyUnicode_Check(key):
        _str_ready(key)
        return True
    return False


cdef inline bint _is_plain(object value) noexcept:
    # Exact types first: nearly every value is one of them. A str is plain
    # when ASCII; any other goes through _check_text.
    return (
        (PyUnicode_CheckExact(value) and PyUnicode_IS_ASCII(value))
        or PyFloat_CheckExact(value)
        or value is None
        or PyBool_Check(value)
        or PyBytes_CheckExact(value)
    )


cdef object _key_error(object label, object key):
    return StateValueError(f"{label} key {key!r} is not a str")


cdef object _surrogate_key_error(object label, object key):
    return StateValueError(f"{label} key {key!r} holds a lone surrogate: it is not storable as UTF-8")


cdef inline object _unprefixed(object key, int code):
    cdef Py_ssize_t skip = 4 if code == _APP else 5
    cdef Py_ssize_t size = PyUnicode_GET_LENGTH(key) - skip
    cdef object out
    if PyUnicode_IS_ASCII(key):
        # Most keys are ASCII: one allocation and a memcpy, without the
        # generic kind and width handling of PyUnicode_Substring().
        out = PyUnicode_New(size, 127)
        memcpy(PyUnicode_1BYTE_DATA(out), PyUnicode_1BYTE_DATA(key) + skip, size)
        return out
    return PyUnicode_Substring(key, skip, skip + size)


cdef inline object _prefixed(str prefix, object key):
    # The prefixes are ASCII; see _unprefixed() for the fast path.
    cdef Py_ssize_t head
    cdef Py_ssize_t size
    cdef object out
    if PyUnicode_IS_ASCII(key):
        head = PyUnicode_GET_LENGTH(prefix)
        size = PyUnicode_GET_LENGTH(key)
        out = PyUnicode_New(head + size, 127)
        memcpy(PyUnicode_1BYTE_DATA(out), PyUnicode_1BYTE_DATA(prefix), head)
        memcpy(PyUnicode_1BYTE_DATA(out) + head, PyUnicode_1BYTE_DATA(key), size)
        return out
    return PyUnicode_Concat(prefix, key)


# A failed check is a list: the message first, then the path steps from the
# innermost outwards. The path is only formatted when a value is refused.

cdef object _check_int(object value):
    cdef int overflow = 0
    PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow == 0:
        return None
    # Above the int64 range: still storable as uint64.
    if overflow > 0 and value <= _UINT64_MAX:
        return None
    return [f"int {value} is out of the 64-bit range"]


cdef bint _has_surrogate(object text) except -1:
    # A lone surrogate cannot be written as UTF-8; only strings stored two
    # or four bytes a character can hold one.
    _str_ready(text)
    cdef int kind = PyUnicode_KIND(text)
    if kind == PyUnicode_1BYTE_KIND:
        return False
    cdef void* data = PyUnicode_DATA(text)
    cdef Py_ssize_t index
    cdef Py_UCS4 char
    for index in range(PyUnicode_GET_LENGTH(text)):
        char = PyUnicode_READ(kind, data, index)
        if 0xD800 <= char <= 0xDFFF:
            return True
    return False


cdef inline bint _bad_text(object text) except -1:
    return not PyUnicode_IS_ASCII(text) and _has_surrogate(text)


cdef object _check(object value, int depth):
    if _is_plain(value):
        return None
    if PyUnicode_Check(value):
        if _bad_text(value):
            return ["str holds a lone surrogate: it is not storable as UTF-8"]
        return None
    if PyLong_CheckExact(value):
        return _check_int(value)
    if PyDict_Check(value) or PyList_Check(value) or PyTuple_Check(value):
        if depth >= _MAX_DEPTH:
            return [f"{type(value).__name__} is nested too deeply (over {MAX_DEPTH} levels)"]
        if PyDict_Check(value):
            return _check_dict(value, depth + 1)
        return _check_items(value, depth + 1)
    if PyFloat_Check(value) or PyBytes_Check(value):
        return None
    if PyLong_Check(value):
        return _check_int(value)
    return [f"{type(value).__name__} is not storable"]


cdef object _check_dict(object value, int depth):
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    cdef object key
    cdef object item
    cdef object problem
    if PyDict_CheckExact(value):
        while PyDict_Next(value, &pos, &k, &v):
            key = <object>k
            item = <object>v
            if not PyUnicode_Check(key):
                return [f"dict key {key!r} is not a str"]
            if _bad_text(key):
                return [f"dict key {key!r} holds a lone surrogate: it is not storable as UTF-8"]
            if _is_plain(item):
                continue
            problem = _check(item, depth)
            if problem is not None:
                problem.append(f"[{key!r}]")
                return problem
        return None
    # A subclass is read through its own items(), as the twin does.
    for key, item in value.items():
        if not PyUnicode_Check(key):
            return [f"dict key {key!r} is not a str"]
        if _bad_text(key):
            return [f"dict key {key!r} holds a lone surrogate: it is not storable as UTF-8"]
        if _is_plain(item):
            continue
        problem = _check(item, depth)
        if problem is not None:
            problem.append(f"[{key!r}]")
            return problem
    return None


cdef object _check_items(object value, int depth):
    cdef Py_ssize_t index = 0
    cdef object item
    cdef object problem
    if PyList_CheckExact(value):
        for item in <list>value:
            if not _is_plain(item):
                problem = _check(item, depth)
                if problem is not None:
                    problem.append(f"[{index}]")
                    return problem
            index += 1
        return None
    if PyTuple_CheckExact(value):
        for item in <tuple>value:
            if not _is_plain(item):
                problem = _check(item, depth)
                if problem is not None:
                    problem.append(f"[{index}]")
                    return problem
            index += 1
        return None
    return _check_subclass_items(value, depth)


cdef object _check_subclass_items(object value, int depth):
    # Apart from _check_items, whose loops over exact lists and tuples would
    # otherwise pay for this code's temporaries.
    cdef Py_ssize_t index = 0
    cdef object item
    cdef object problem
    # A tuple subclass is stored as a list, except msgpack's ExtType (a
    # namedtuple): msgpack packs it as an extension, which reads back as an
    # ExtType.
    if PyType_IsSubtype(type(value), _EXT_TYPE):
        return [f"{type(value).__name__} is not storable"]
    # A subclass is read through its own iterator, as the twin does.
    for item in value:
        if not _is_plain(item):
            problem = _check(item, depth)
            if problem is not None:
                problem.append(f"[{index}]")
                return problem
        index += 1
    return None


cdef object _refuse(object path, list problem):
    cdef str steps = "".join(reversed(problem[1:]))
    return StateValueError(f"{path}{steps}: {problem[0]}")


def scope_of(key):
    """Return the scope of a state key."""
    if not _is_str(key):
        raise _key_error("state", key)
    cdef int code = _scope_code(key)
    if code == _APP:
        return _SCOPE_APP
    if code == _USER:
        return _SCOPE_USER
    if code == _TEMP:
        return _SCOPE_TEMP
    return _SCOPE_SESSION


cdef int _route(
    object key, object value, dict app, dict user, dict session, dict temp, bint check
) except -1:
    if not _is_str(key):
        raise _key_error("state", key)
    cdef int code = _scope_code(key)
    # Temp values live only on the live session object, so anything goes.
    if code == _TEMP:
        PyDict_SetItem(temp, key, value)
        return 0
    cdef object problem
    if check and _bad_text(key):
        raise _surrogate_key_error("state", key)
    if check and not _is_plain(value):
        problem = _check(value, 0)
        if problem is not None:
            raise _refuse(f"state[{key!r}]", problem)
    if code == _SESSION:
        PyDict_SetItem(session, key, value)
    elif code == _APP:
        PyDict_SetItem(app, _unprefixed(key, code), value)
    else:
        PyDict_SetItem(user, _unprefixed(key, code), value)
    return 0


cdef tuple _partition(object delta, bint check):
    cdef dict app = {}
    cdef dict user = {}
    cdef dict session = {}
    cdef dict temp = {}
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    if PyDict_CheckExact(delta):
        while PyDict_Next(delta, &pos, &k, &v):
            _route(<object>k, <object>v, app, user, session, temp, check)
    else:
        for key, value in delta.items():
            _route(key, value, app, user, session, temp, check)
    return app, user, session, temp


def partition_by_scope(delta):
    """Split a delta into (app, user, session, temp) maps, app and user keys unprefixed."""
    return _partition(delta, False)


def partition_checked(delta):
    """Validate a delta and split it into (app, user, session, temp) maps in one pass."""
    return _partition(delta, True)


def trim_temp_keys(delta):
    """Return a copy of a delta without its ``temp:`` keys."""
    cdef dict trimmed = {}
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    if PyDict_CheckExact(delta):
        while PyDict_Next(delta, &pos, &k, &v):
            if not _is_str(<object>k):
                raise _key_error("state", <object>k)
            if _scope_code(<object>k) != _TEMP:
                PyDict_SetItem(trimmed, <object>k, <object>v)
        return trimmed
    for key, value in delta.items():
        if not _is_str(key):
            raise _key_error("state", key)
        if _scope_code(key) != _TEMP:
            PyDict_SetItem(trimmed, key, value)
    return trimmed


cdef int _merge_prefixed(dict merged, object scoped, str prefix, str label) except -1:
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    if PyDict_CheckExact(scoped):
        while PyDict_Next(scoped, &pos, &k, &v):
            if not _is_str(<object>k):
                raise _key_error(label, <object>k)
            PyDict_SetItem(merged, _prefixed(prefix, <object>k), <object>v)
        return 0
    for key, value in scoped.items():
        if not _is_str(key):
            raise _key_error(label, key)
        PyDict_SetItem(merged, _prefixed(prefix, key), value)
    return 0


def merge_scopes(app, user, session):
    """Return the state a caller sees: session keys, then prefixed app and user keys."""
    cdef dict merged
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    if PyDict_CheckExact(session):
        # Copying the whole table at once beats inserting key by key.
        merged = PyDict_Copy(session)
    else:
        merged = dict(session)
    while PyDict_Next(merged, &pos, &k, &v):
        if not PyUnicode_Check(<object>k):
            raise _key_error("session state", <object>k)
    _merge_prefixed(merged, app, _APP_PREFIX, "app state")
    _merge_prefixed(merged, user, _USER_PREFIX, "user state")
    return merged


def apply_delta(state, delta):
    """Set every key of a delta on a state, in order; a None value is stored."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    cdef bint exact_state = PyDict_CheckExact(state)
    if PyDict_CheckExact(delta):
        # Keys are checked first so that a bad key leaves the state untouched.
        while PyDict_Next(delta, &pos, &k, &v):
            if not PyUnicode_Check(<object>k):
                raise _key_error("state", <object>k)
        pos = 0
        if exact_state:
            while PyDict_Next(delta, &pos, &k, &v):
                PyDict_SetItem(state, <object>k, <object>v)
            return
        # A mapping's __setitem__ is Python code that may change the delta:
        # iterate with owned references and the dict's own size check.
        for key, value in (<dict>delta).items():
            PyObject_SetItem(state, key, value)
        return
    for key in delta:
        if not PyUnicode_Check(key):
            raise _key_error("state", key)
    for key, value in delta.items():
        if exact_state:
            PyDict_SetItem(state, key, value)
        else:
            PyObject_SetItem(state, key, value)


def check_storable(value, path):
    """Raise StateValueError, naming the key path, unless a value can be stored."""
    cdef object problem = _check(value, 0)
    if problem is not None:
        raise _refuse(path, problem)


def check_delta(delta, root="state"):
    """Raise StateValueError unless every key of a delta is a str and every value storable."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    cdef object problem
    if PyDict_CheckExact(delta):
        while PyDict_Next(delta, &pos, &k, &v):
            if not PyUnicode_Check(<object>k):
                raise _key_error(root, <object>k)
            if _bad_text(<object>k):
                raise _surrogate_key_error(root, <object>k)
            if _is_plain(<object>v):
                continue
            problem = _check(<object>v, 0)
            if problem is not None:
                raise _refuse(f"{root}[{(<object>k)!r}]", problem)
        return
    for key, value in delta.items():
        if not PyUnicode_Check(key):
            raise _key_error(root, key)
        if _bad_text(key):
            raise _surrogate_key_error(root, key)
        if _is_plain(value):
            continue
        problem = _check(value, 0)
        if problem is not None:
            raise _refuse(f"{root}[{key!r}]", problem)


# -- packing plain values ---------------------------------------------------------
#
# pack_plain writes msgpack itself, in the forms msgpack-python picks with the
# codec's options (use_bin_type: str8 for short text, bin for bytes; the
# smallest int form; floats as float64), into one growing C buffer: one walk
# both checks that a value is plain and packs it, where the general path walks
# it to check, and again to pack.

# The same depth limit as the twin's _PLAIN_DEPTH.
cdef int _PLAIN_DEPTH = 64
cdef uint64_t _MSGPACK_MAX = 0xFFFFFFFF


cdef struct _Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity


cdef inline int _reserve(_Buffer* buf, Py_ssize_t more) except -1:
    cdef Py_ssize_t need = buf.size + more
    cdef Py_ssize_t capacity
    cdef char* grown
    if need <= buf.capacity:
        return 0
    capacity = buf.capacity * 2
    if capacity < need:
        capacity = need
    grown = <char*>realloc(buf.data, capacity)
    if grown == NULL:
        raise MemoryError()
    buf.data = grown
    buf.capacity = capacity
    return 0


cdef inline void _big_endian(char* data, uint64_t value, int width) noexcept:
    """Write ``value`` big-endian in ``width`` bytes (0 to 8) at ``data``."""
    cdef int index
    for index in range(width):
        data[index] = <char>((value >> (8 * (width - 1 - index))) & 0xFF)


cdef inline int _put_head(
    _Buffer* buf, unsigned char code, uint64_t value, int width
) except -1:
    """Write a type byte, then ``value`` big-endian in ``width`` bytes (0 to 8)."""
    _reserve(buf, 1 + width)
    buf.data[buf.size] = <char>code
    _big_endian(buf.data + buf.size + 1, value, width)
    buf.size += 1 + width
    return 0


cdef inline int _put_raw(_Buffer* buf, const char* data, Py_ssize_t size) except -1:
    _reserve(buf, size)
    memcpy(buf.data + buf.size, data, size)
    buf.size += size
    return 0


cdef int _put_int(_Buffer* buf, object value) except -1:
    """Pack an int of the 64-bit range; 0 for one outside it."""
    cdef int overflow = 0
    cdef long long number = PyLong_AsLongLongAndOverflow(value, &overflow)
    cdef unsigned long long unsigned_number
    if overflow < 0:
        return 0
    if overflow > 0:
        try:
            unsigned_number = PyLong_AsUnsignedLongLong(value)
        except OverflowError:
            return 0
        _put_head(buf, 0xCF, unsigned_number, 8)
        return 1
    if number < -(1 << 5):
        if number < -(1 << 15):
            if number < -(1LL << 31):
                _put_head(buf, 0xD3, <uint64_t>number, 8)
            else:
                _put_head(buf, 0xD2, <uint64_t>number, 4)
        elif number < -(1 << 7):
            _put_head(buf, 0xD1, <uint64_t>number, 2)
        else:
            _put_head(buf, 0xD0, <uint64_t>number, 1)
    elif number < (1 << 7):
        # A positive or negative fixint: the number's own low byte.
        _put_head(buf, <unsigned char>(number & 0xFF), 0, 0)
    elif number < (1 << 16):
        if number < (1 << 8):
            _put_head(buf, 0xCC, <uint64_t>number, 1)
        else:
            _put_head(buf, 0xCD, <uint64_t>number, 2)
    elif number < (1LL << 32):
        _put_head(buf, 0xCE, <uint64_t>number, 4)
    else:
        _put_head(buf, 0xCF, <uint64_t>number, 8)
    return 1


cdef int _put_sized(
    _Buffer* buf, Py_ssize_t size, unsigned char fix, Py_ssize_t fix_limit,
    unsigned char code8, unsigned char code16, unsigned char code32,
) except -1:
    """Write the header of a str, bin, array or map of ``size``; 0 when too long."""
    if <uint64_t>size > _MSGPACK_MAX:
        return 0
    if size < fix_limit:
        _put_head(buf, fix | <unsigned char>size, 0, 0)
    elif code8 and size < 256:
        _put_head(buf, code8, <uint64_t>size, 1)
    elif size < 65536:
        _put_head(buf, code16, <uint64_t>size, 2)
    else:
        _put_head(buf, code32, <uint64_t>size, 4)
    return 1


cdef int _put_str(_Buffer* buf, object text) except -1:
    """Pack a str as UTF-8; 0 for one that holds a lone surrogate or is too long."""
    cdef Py_ssize_t size
    cdef const char* data
    _str_ready(text)
    if PyUnicode_IS_ASCII(text):
        # Compact ASCII text: its characters are its UTF-8 bytes.
        size = PyUnicode_GET_LENGTH(text)
        data = <const char*>PyUnicode_DATA(text)
    else:
        try:
            data = PyUnicode_AsUTF8AndSize(text, &size)
        except UnicodeEncodeError:
            return 0
    if not _put_sized(buf, size, 0xA0, 32, 0xD9, 0xDA, 0xDB):
        return 0
    _put_raw(buf, data, size)
    return 1


cdef int _put_value(_Buffer* buf, object value, int depth, dict plans) except -1:
    """Pack a plain value (see pack_plain); 0, with the buffer in any state, for another.

    With ``plans`` (see pack_model), also a str subclass, as its text, and a
    model of a planned class, at any place a value may be.
    """
    cdef double number
    cdef uint64_t bits
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t index
    cdef Py_ssize_t size
    cdef PyObject* k = NULL
    cdef PyObject* v = NULL
    if value is None:
        return _put_head(buf, 0xC0, 0, 0) + 1
    if value is True:
        return _put_head(buf, 0xC3, 0, 0) + 1
    if value is False:
        return _put_head(buf, 0xC2, 0, 0) + 1
    if PyUnicode_CheckExact(value):
        return _put_str(buf, value)
    if PyLong_CheckExact(value):
        return _put_int(buf, value)
    if PyFloat_CheckExact(value):
        number = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &number, 8)
        return _put_head(buf, 0xCB, bits, 8) + 1
    if PyBytes_CheckExact(value):
        size = PyBytes_GET_SIZE(value)
        if not _put_sized(buf, size, 0, 0, 0xC4, 0xC5, 0xC6):
            return 0
        return _put_raw(buf, PyBytes_AS_STRING(value), size) + 1
    if plans is not None and PyUnicode_Check(value):
        # A str enum member packs as its text, as msgpack packs a str subclass.
        return _put_str(buf, value)
    if depth >= _PLAIN_DEPTH:
        return 0
    if PyDict_CheckExact(value):
        if not _put_sized(buf, len(value), 0x80, 16, 0, 0xDE, 0xDF):
            return 0
        while PyDict_Next(value, &pos, &k, &v):
            if not PyUnicode_CheckExact(<object>k) or not _put_str(buf, <object>k):
                return 0
            if not _put_value(buf, <object>v, depth + 1, plans):
                return 0
        return 1
    if PyList_CheckExact(value):
        size = PyList_GET_SIZE(value)
        if not _put_sized(buf, size, 0x90, 16, 0, 0xDC, 0xDD):
            return 0
        # The list cannot change meanwhile: packing calls no Python code.
        for index in range(size):
            if not _put_value(buf, <object>PyList_GET_ITEM(value, index), depth + 1, plans):
                return 0
        return 1
    if plans is None:
        return 0
    plan = plans.get(type(value))
    if plan is None:
        return 0
    return _put_model(buf, value, plan, depth, plans)


cdef inline int _put_plain(_Buffer* buf, object value, int depth) except -1:
    """Pack a plain value (see pack_plain); 0, with the buffer in any state, for another."""
    return _put_value(buf, value, depth, None)


# One buffer for every call, grown as needed: packing runs under the GIL and
# runs no Python code on its way. Only a failed step may (the exception it
# makes can start the collector, and a finalizer could pack): a call that
# finds the buffer in use takes one of its own. A buffer grown past
# _KEPT_CAPACITY by a large value is given back after that call.
cdef _Buffer _shared = _Buffer(NULL, 0, 0)
cdef bint _shared_busy = False
cdef Py_ssize_t _KEPT_CAPACITY = 1 << 16


cdef _Buffer* _take_buffer(_Buffer* own) noexcept:
    """Return the shared buffer, or ``own`` (empty) while another call holds the shared one."""
    global _shared_busy
    if _shared_busy:
        own[0] = _Buffer(NULL, 0, 0)
        return own
    _shared_busy = True
    return &_shared


cdef int _start(_Buffer* buf, bytes prefix) except -1:
    """Empty the buffer, give it room, and write ``prefix`` first."""
    cdef Py_ssize_t size
    if buf.data == NULL:
        buf.data = <char*>malloc(4096)
        if buf.data == NULL:
            raise MemoryError()
        buf.capacity = 4096
    buf.size = 0
    size = PyBytes_GET_SIZE(prefix)
    if size:
        _put_raw(buf, PyBytes_AS_STRING(prefix), size)
    return 0


cdef void _give_back(_Buffer* buf) noexcept:
    """Free a call's own buffer, or a shared one grown too large, and free the shared one."""
    global _shared_busy
    if buf is not &_shared or buf.capacity > _KEPT_CAPACITY:
        free(buf.data)
        buf.data = NULL
        buf.capacity = 0
    if buf is &_shared:
        _shared_busy = False


def pack_plain(value, prefix=b""):
    """Return ``prefix`` and the msgpack bytes of a plain value, or None: the caller packs it."""
    cdef _Buffer own
    cdef _Buffer* buf
    if not PyBytes_CheckExact(prefix):
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    buf = _take_buffer(&own)
    try:
        _start(buf, prefix)
        if not _put_plain(buf, value, 0):
            return None
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        _give_back(buf)


# -- packing an event's record ----------------------------------------------------
#
# pack_event writes the map an event's record is, straight from the event's
# attributes, where pack_plain(record) would walk a dict built from them first:
# the same bytes, without a dict per event. Both maps have at most 15 entries
# (fixmap), so a one-byte header is written first and set once they are counted.
#
# The event's attributes are read through getattr, about twenty times an
# append: a public C call each (PyObject_GetAttr), whatever the event's class.

cdef int _FIXMAP_MAX = 15


cdef inline bint _is_empty_dict(object value) noexcept:
    return PyDict_CheckExact(value) and PyDict_Size(value) == 0


cdef int _put_entry(_Buffer* buf, str name, object value, int depth) except -1:
    """Pack a map entry: ``name``, then a plain value at ``depth``; 0 for another value."""
    if not _put_str(buf, name):
        return 0
    return _put_plain(buf, value, depth)


cdef int _put_set_field(_Buffer* buf, str name, object value, int depth, int* count) except -1:
    """Pack a field that is set: not None, and not empty text.

    0 for a value of another type than the plain ones (the caller's general
    path decides whether it is empty, and how it packs).
    """
    if value is None:
        return 1
    if PyUnicode_CheckExact(value):
        if PyUnicode_GET_LENGTH(value) == 0:
            return 1
    elif not (
        PyDict_CheckExact(value)
        or PyList_CheckExact(value)
        or PyBool_Check(value)
        or PyLong_CheckExact(value)
        or PyFloat_CheckExact(value)
        or PyBytes_CheckExact(value)
    ):
        return 0
    if not _put_entry(buf, name, value, depth):
        return 0
    count[0] += 1
    return 1


cdef int _put_map_entry(
    _Buffer* buf, str name, object value, int depth, int* count
) except -1:
    """Pack ``name`` and a dict when it is not empty (a falsy map is left out); 0 for another value."""
    if value is None or _is_empty_dict(value):
        return 1
    if not PyDict_CheckExact(value):
        return 0
    if not _put_entry(buf, name, value, depth):
        return 0
    count[0] += 1
    return 1


cdef int _put_event(_Buffer* buf, object event, tuple fields, tuple action_fields) except -1:
    """Pack an event's record (see pack_event); 0, with the buffer in any state, for another."""
    cdef Py_ssize_t head = buf.size
    cdef Py_ssize_t actions_head
    cdef Py_ssize_t actions_start
    cdef Py_ssize_t index
    cdef Py_ssize_t size = PyTuple_GET_SIZE(fields)
    cdef int count = 2
    cdef int actions_count = 0
    _put_head(buf, 0x80, 0, 0)
    if not _put_entry(buf, "id", event.id, 1):
        return 0
    if not _put_entry(buf, "timestamp", event.timestamp, 1):
        return 0
    for index in range(size):
        if not _put_set_field(buf, fields[index], getattr(event, fields[index]), 1, &count):
            return 0
    actions = event.actions
    actions_start = buf.size
    _put_str(buf, "actions")
    actions_head = buf.size
    _put_head(buf, 0x80, 0, 0)
    if not _put_map_entry(buf, "state_delta", actions.state_delta, 2, &actions_count):
        return 0
    if not _put_map_entry(
        buf, "artifact_delta", actions.artifact_delta, 2, &actions_count
    ):
        return 0
    for index in range(PyTuple_GET_SIZE(action_fields)):
        value = getattr(actions, action_fields[index])
        if value is None:
            continue
        if not _put_entry(buf, action_fields[index], value, 2):
            return 0
        actions_count += 1
    if not _put_map_entry(
        buf, "extra", actions.extra, 2,
        &actions_count,
    ):
        return 0
    if actions_count:
        if actions_count > _FIXMAP_MAX:
            return 0
        buf.data[actions_head] = <char>(0x80 | actions_count)
        count += 1
    else:
        buf.size = actions_start
    if not _put_map_entry(buf, "extra", event.extra, 1, &count):
        return 0
    if count > _FIXMAP_MAX:
        return 0
    buf.data[head] = <char>(0x80 | count)
    return 1


def pack_event(event, fields, action_fields, prefix=b""):
    """Return ``prefix`` and the msgpack bytes of an event's record, or None: the caller packs it.

    The record is the map of the event's ``id`` and ``timestamp``, each of
    ``fields`` set (not None, not empty text), its ``actions`` when any of
    them is set (a non-empty ``state_delta``, ``artifact_delta`` and
    ``extra``; each of ``action_fields`` not None), and a non-empty ``extra``:
    the bytes ``pack_plain`` gives for that map. None for a record that is not
    plain (see ``pack_plain``), for a field of another type than the plain
    ones, a delta or ``extra`` that is not a dict, and a map of more than 15
    entries.
    """
    cdef _Buffer own
    cdef _Buffer* buf
    if not PyBytes_CheckExact(prefix):
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if not PyTuple_CheckExact(fields) or not PyTuple_CheckExact(action_fields):
        raise TypeError("fields and action_fields must be tuples of str")
    # Attribute reads can run Python code: a call made meanwhile takes a buffer of its own.
    buf = _take_buffer(&own)
    try:
        _start(buf, prefix)
        if not _put_event(buf, event, fields, action_fields):
            return None
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        _give_back(buf)


# -- packing a model's dump -------------------------------------------------------------
#
# pack_model writes the map a model dump would be (its set fields under their
# serialization names, nested models as maps), straight from the models'
# field values, where pack_plain(dump) would wait for the dump to be built.
# Which classes it walks, and how each field packs, is the caller's plan: a
# class it has no plan for gives None, and the caller dumps the model itself.

# How a planned field packs when it is set, besides as it is (FIELD_AS_IS):
# the twin's codes, as C ints.
cdef long _FIELD_SORTED = FIELD_SORTED
cdef long _FIELD_REFUSED = FIELD_REFUSED


cdef str _BAD_PLAN = (
    "plans must map classes to tuples of (name, serialization name, how) tuples, how 0 to 2"
)
# A map16 header counts this many entries at most.
cdef int _MAP16_MAX = 0xFFFF


cdef int _put_model(_Buffer* buf, object model, object plan, int depth, dict plans) except -1:
    """Pack a model's set fields as a map, by ``plan``; 0 for a value the plan does not pack."""
    cdef Py_ssize_t head = buf.size
    cdef Py_ssize_t body
    cdef int count = 0
    cdef long how
    if not PyTuple_CheckExact(plan):
        raise TypeError(_BAD_PLAN)
    # The values of a model's fields, read from the instance's own dict; a
    # class that keeps them elsewhere gives None (the caller dumps it).
    fields = getattr(model, "__dict__", None)
    if not PyDict_CheckExact(fields):
        return 0
    # Room for a map16 header: the number of set fields is known at the end.
    _reserve(buf, 3)
    buf.size += 3
    body = buf.size
    for entry in <tuple>plan:
        if not PyTuple_CheckExact(entry) or PyTuple_GET_SIZE(entry) != 3:
            raise TypeError(_BAD_PLAN)
        name, alias, code = <tuple>entry
        if not PyUnicode_CheckExact(alias) or not PyLong_CheckExact(code):
            raise TypeError(_BAD_PLAN)
        if not FIELD_AS_IS <= code <= FIELD_REFUSED:
            raise TypeError(_BAD_PLAN)
        how = code
        value = (<dict>fields).get(name, _ABSENT)
        if value is _ABSENT:
            return 0
        if value is None:
            continue
        if how == _FIELD_REFUSED:
            return 0
        if how == _FIELD_SORTED:
            if not (type(value) is set or type(value) is frozenset):
                return 0
            for item in value:
                # Only exact str items: comparing them while sorting runs no Python code.
                if not PyUnicode_CheckExact(item):
                    return 0
            value = sorted(value)
        if not _put_str(buf, alias) or not _put_value(buf, value, depth + 1, plans):
            return 0
        count += 1
    if count > _MAP16_MAX:
        return 0
    if count < 16:
        # A fixmap, as msgpack writes a small map: the body moves up two bytes.
        buf.data[head] = <char>(0x80 | count)
        memmove(buf.data + head + 1, buf.data + body, buf.size - body)
        buf.size -= 2
    else:
        buf.data[head] = <char>0xDE
        _big_endian(buf.data + head + 1, <uint64_t>count, 2)
    return 1


cdef object _ABSENT = object()


def pack_model(model, plans, prefix=b""):
    """Return ``prefix`` and the msgpack bytes of a model's dump, or None: the caller dumps it.

    ``plans`` maps each model class to walk to its fields, in order, as
    ``(name, serialization name, how)``: ``how`` ``FIELD_AS_IS`` packs a set
    value as it is, ``FIELD_SORTED`` a set of str as a sorted list, and
    ``FIELD_REFUSED`` gives None when the field is set. A field whose value
    is None is left out, as ``exclude_none`` leaves it out. Values are plain
    (see ``pack_plain``; a str subclass packs as its text), models of a
    planned class, and dicts and lists of them.
    None for any other value, a model of a class without a plan, and a model
    whose fields are not in its instance dict.
    """
    cdef _Buffer own
    cdef _Buffer* buf
    if not PyBytes_CheckExact(prefix):
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if not PyDict_CheckExact(plans):
        raise TypeError(f"plans must be a dict, not {type(plans).__name__}")
    plan = (<dict>plans).get(type(model))
    if plan is None:
        return None
    # Reading an instance's dict can run Python code: a call made meanwhile
    # takes a buffer of its own.
    buf = _take_buffer(&own)
    try:
        _start(buf, prefix)
        if not _put_model(buf, model, plan, 0, <dict>plans):
            return None
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        _give_back(buf)


# -- store key and value bytes --------------------------------------------------------
#
# Two byte strings the LMDB store makes for every event of a batch, each in
# one allocation, where Python would make each piece and then join them.


def sortable_time(timestamp):
    """Return 8 bytes that sort as the float ``timestamp`` does, negatives included.

    The IEEE bits, big-endian, with the sign bit set for a positive number
    and every bit flipped for a negative one. -0.0 gives the bytes of 0.0:
    the two zeros compare equal, so they must sort equal.
    """
    # As the twin's timestamp + 0.0: a number, or TypeError (OverflowError for a huge int).
    cdef double number = timestamp + 0.0
    cdef uint64_t bits
    memcpy(&bits, &number, 8)
    if bits >> 63:
        bits = ~bits
    else:
        bits |= (<uint64_t>1) << 63
    out = PyBytes_FromStringAndSize(NULL, 8)
    _big_endian(PyBytes_AS_STRING(out), bits, 8)
    return out


cdef Py_ssize_t _put_decimal(char* out, unsigned long long value) noexcept:
    """Write ``value`` in decimal digits at ``out``; return how many."""
    cdef char digits[20]
    cdef Py_ssize_t size = 0
    cdef Py_ssize_t index
    while True:
        digits[size] = <char>(48 + value % 10)
        value = value // 10
        size += 1
        if value == 0:
            break
    for index in range(size):
        out[index] = digits[size - 1 - index]
    return size


cdef inline bint _as_count(object value, long long* out) noexcept:
    """Store ``value`` at ``out`` if it is an exact int from 0 to 2**63 - 1; tell whether it was."""
    cdef int overflow = 0
    if not PyLong_CheckExact(value):
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return not overflow and out[0] >= 0


def revision_marker(number, count, removed):
    """Return a session's revision marker (``SessionRecord.marker``).

    ``number:count`` (the session's number, the events appended to it),
    then ``:removed`` once a truncation removed events. Written in C for
    exact ints from 0 to 2**63 - 1, what a store holds; anything else is
    formatted as the twin formats it.
    """
    cdef long long first, second, third
    cdef char text[64]
    cdef Py_ssize_t size
    if _as_count(number, &first) and _as_count(count, &second) and _as_count(removed, &third):
        size = _put_decimal(text, <unsigned long long>first)
        text[size] = 58  # ":"
        size += 1
        size += _put_decimal(text + size, <unsigned long long>second)
        if third:
            text[size] = 58
            size += 1
            size += _put_decimal(text + size, <unsigned long long>third)
        return text[:size].decode("ascii")
    if removed:
        return f"{number}:{count}:{removed}"
    return f"{number}:{count}"


def timed_record(timestamp, record):
    """Return a float timestamp as 8 bytes (big-endian IEEE double), then the bytes ``record``."""
    cdef double number
    cdef Py_ssize_t size
    cdef uint64_t bits
    if not PyFloat_CheckExact(timestamp):
        raise TypeError(f"timestamp must be a float, not {type(timestamp).__name__}")
    if not PyBytes_CheckExact(record):
        raise TypeError(f"record must be bytes, not {type(record).__name__}")
    number = PyFloat_AS_DOUBLE(timestamp)
    size = PyBytes_GET_SIZE(record)
    out = PyBytes_FromStringAndSize(NULL, 8 + size)
    cdef char* data = PyBytes_AS_STRING(out)
    memcpy(&bits, &number, 8)
    _big_endian(data, bits, 8)
    memcpy(data + 8, PyBytes_AS_STRING(record), size)
    return out


def sized_key(prefix, text, limit):
    """Return ``prefix``, the UTF-8 size of ``text`` in two bytes, then its UTF-8, or None.

    None for text longer than ``limit`` bytes of UTF-8 (at most 65,535, the
    two bytes' range) and for anything but an exact str (a subclass may
    encode itself another way: the caller encodes it). Text that is not
    encodable as UTF-8 raises UnicodeEncodeError, as ``str.encode`` does.
    """
    cdef Py_ssize_t start
    cdef Py_ssize_t size
    cdef Py_ssize_t most
    cdef const char* raw
    if not PyBytes_CheckExact(prefix):
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if not PyLong_CheckExact(limit) or not 0 <= limit <= 0xFFFF:
        raise ValueError(f"limit must be an int in 0 to 65535, not {limit!r}")
    if not PyUnicode_CheckExact(text):
        return None
    most = limit
    start = PyBytes_GET_SIZE(prefix)
    _str_ready(text)
    if PyUnicode_IS_ASCII(text):
        size = PyUnicode_GET_LENGTH(text)
        raw = <const char*>PyUnicode_DATA(text)
    else:
        raw = PyUnicode_AsUTF8AndSize(text, &size)
    if size > most:
        return None
    out = PyBytes_FromStringAndSize(NULL, start + 2 + size)
    cdef char* data = PyBytes_AS_STRING(out)
    memcpy(data, PyBytes_AS_STRING(prefix), start)
    _big_endian(data + start, <uint64_t>size, 2)
    memcpy(data + start + 2, raw, size)
    return out


# -- reading records ------------------------------------------------------------------


cdef inline Py_ssize_t _read_big(const unsigned char* data, int width) noexcept:
    cdef Py_ssize_t value = 0
    cdef int i
    for i in range(width):
        value = (value << 8) | data[i]
    return value


cdef Py_ssize_t _skip(const unsigned char* data, Py_ssize_t at, Py_ssize_t end) noexcept:
    """Return where the msgpack object at ``data[at:]`` ends; -1 if it does not end by ``end``."""
    cdef Py_ssize_t pending = 1
    cdef Py_ssize_t size
    cdef unsigned char kind
    cdef int width
    while pending:
        # Every object left takes at least a byte (which also bounds ``pending``).
        if pending > end - at:
            return -1
        kind = data[at]
        at += 1
        pending -= 1
        if kind <= 0x7F or kind >= 0xE0:  # fixint
            continue
        if kind <= 0x8F:  # fixmap
            pending += 2 * (kind & 0x0F)
            continue
        if kind <= 0x9F:  # fixarray
            pending += kind & 0x0F
            continue
        if kind <= 0xBF:  # fixstr
            at += kind & 0x1F
        elif kind == 0xC0 or kind == 0xC2 or kind == 0xC3:  # nil, false, true
            continue
        elif kind == 0xCA:
            at += 4
        elif kind == 0xCB:
            at += 8
        elif 0xCC <= kind <= 0xD3:  # uint8 to int64: 1, 2, 4, 8 bytes
            at += 1 << ((kind - 0xCC) & 3)
        elif 0xD4 <= kind <= 0xD8:  # fixext: a type byte and 1, 2, 4, 8, 16 bytes
            at += 1 + (1 << (kind - 0xD4))
        elif kind == 0xC1:  # never used
            return -1
        else:
            if kind == 0xC4 or kind == 0xD9 or kind == 0xC7:  # bin8, str8, ext8
                width = 1
            elif kind == 0xC5 or kind == 0xDA or kind == 0xC8 or kind == 0xDC or kind == 0xDE:
                width = 2
            else:  # bin32, str32, ext32, array32, map32
                width = 4
            if width > end - at:
                return -1
            size = _read_big(data + at, width)
            at += width
            if kind == 0xDC or kind == 0xDD:  # arrays
                pending += size
            elif kind == 0xDE or kind == 0xDF:  # maps
                pending += 2 * size
            elif kind == 0xC7 or kind == 0xC8 or kind == 0xC9:  # ext: a type byte, then data
                if size > end - at:
                    return -1
                at += 1 + size
            else:
                if size > end - at:
                    return -1
                at += size
        if at > end:
            return -1
    return at


cdef bytes _array_head(Py_ssize_t count):
    if count < 16:
        return bytes([0x90 | count])
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def last_values(records, prefix, key):
    """Return one msgpack array of the value each record holds under ``key``, or None.

    Each record must be ``prefix``, then one msgpack map whose last entry is
    ``key`` (packed as msgpack packs a str) and its value, and nothing after
    it. The array's items are those values' bytes as stored, so the caller
    decodes them all in one call and decodes nothing else of the records.
    Every object of every record is walked, so each item is exactly one
    msgpack object. None when a record is laid out otherwise (the caller
    then decodes each record whole, which says what is wrong).
    """
    cdef Py_ssize_t count, index, at, end, size, entries, total, start, walked
    cdef Py_ssize_t prefix_size, key_size, head_size
    cdef const unsigned char* data
    cdef const char* key_data
    cdef unsigned char kind
    cdef Py_ssize_t* starts
    cdef char* out_data
    if not PyList_CheckExact(records):
        raise TypeError(f"records must be a list, not {type(records).__name__}")
    if not PyBytes_CheckExact(prefix):
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if not PyUnicode_CheckExact(key):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    packed_key = pack_plain(key)
    if packed_key is None:
        raise TypeError("key is not plain")  # cannot happen for a str
    key_data = PyBytes_AS_STRING(packed_key)
    key_size = PyBytes_GET_SIZE(packed_key)
    prefix_size = PyBytes_GET_SIZE(prefix)
    count = PyList_GET_SIZE(records)
    head = _array_head(count)
    head_size = PyBytes_GET_SIZE(head)
    starts = <Py_ssize_t*>malloc((count + 1) * sizeof(Py_ssize_t))
    if starts == NULL:
        raise MemoryError()
    try:
        total = head_size
        for index in range(count):
            record = <object>PyList_GET_ITEM(records, index)
            if not PyBytes_CheckExact(record):
                return None
            data = <const unsigned char*>PyBytes_AS_STRING(record)
            end = PyBytes_GET_SIZE(record)
            if end <= prefix_size or memcmp(data, PyBytes_AS_STRING(prefix), prefix_size) != 0:
                return None
            at = prefix_size
            kind = data[at]
            at += 1
            if 0x80 <= kind <= 0x8F:
                entries = kind & 0x0F
            elif kind == 0xDE or kind == 0xDF:
                size = 2 if kind == 0xDE else 4
                if size > end - at:
                    return None
                entries = _read_big(data + at, <int>size)
                at += size
            else:
                return None
            if entries == 0:
                return None
            for walked in range(2 * (entries - 1)):  # the entries before the last
                at = _skip(data, at, end)
                if at < 0:
                    return None
            if key_size > end - at or memcmp(data + at, key_data, key_size) != 0:
                return None
            at += key_size
            if at >= end or _skip(data, at, end) != end:
                return None
            starts[index] = at
            total += end - at
        out = PyBytes_FromStringAndSize(NULL, total)
        out_data = PyBytes_AS_STRING(out)
        memcpy(out_data, PyBytes_AS_STRING(head), head_size)
        start = head_size
        for index in range(count):
            record = <object>PyList_GET_ITEM(records, index)
            size = PyBytes_GET_SIZE(record) - starts[index]
            memcpy(out_data + start, PyBytes_AS_STRING(record) + starts[index], size)
            start += size
        return out
    finally:
        free(starts)
