"""A listing page's metadata: one ``SessionMeta`` for each session record.

Written once, as annotated Python in Cython's pure-Python mode: ``setup.py``
compiles this file a second time as ``sessionscope.service._listing_c``, and this
module stays importable as it is, the twin that runs where nothing was
compiled (``sessionscope.core.compiled_or_twin`` picks one).

A whole listing builds one frozen ``SessionMeta`` per session, and that is
the larger part of its time: the dataclass's ``__init__`` sets each field
through ``object.__setattr__``, a Python-level call per field. The compiled
build sets the same fields through the C function behind it,
``PyObject_GenericSetAttr``, which makes the same object in a third less
time; the twin calls ``object.__setattr__`` as the dataclass does.

The compiled build also takes each meta out of the cyclic collector's
watch (``PyObject_GC_UnTrack``, public C API): a meta's fields are str,
float and int, so it can never be part of a cycle, and the collector
passed over the metas again and again while a listing was made (a listing
of 10,000 sessions set off about 40 of its passes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import revision_marker
from ..model import SessionMeta

if TYPE_CHECKING:
    from .._speedups import _no_cython as cython
    from ..stores.records import SessionRecord
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from .._speedups import _no_cython as cython

if TYPE_CHECKING:
    _set_field = object.__setattr__
    _untrack: Any = None
elif cython.compiled:
    from cython.cimports.cpython.object import PyObject_GenericSetAttr as _set_field
    from cython.cimports.sessionscope._speedups._gc import PyObject_GC_UnTrack as _untrack
else:
    _set_field = object.__setattr__

__all__ = ["metas"]

_new = object.__new__


def metas(page: list[SessionRecord]) -> list[SessionMeta]:
    """Return the listing metadata of each record, in the page's order."""
    built: list[SessionMeta] = []
    record: Any
    for record in page:
        meta = _new(SessionMeta)
        _set_field(meta, "id", record.session_id)
        _set_field(meta, "app_name", record.app_name)
        _set_field(meta, "user_id", record.user_id)
        _set_field(meta, "last_update_time", record.last_update_time)
        _set_field(meta, "create_time", record.create_time)
        count = record.event_count
        removed = record.removed_count
        _set_field(meta, "event_count", count - removed)
        # SessionRecord.marker without the property's Python call.
        _set_field(meta, "revision", revision_marker(record.number, count, removed))
        if cython.compiled:
            # Out of the collector's watch: see the module's docstring.
            _untrack(cython.cast(cython.p_void, meta))
        built.append(meta)
    return built
