"""Stub of the compiled scope core; the pure-Python twin holds the same signatures."""

from collections.abc import Mapping, MutableMapping
from typing import Any

from sessionscope._speedups._core_py import APP_PREFIX as APP_PREFIX
from sessionscope._speedups._core_py import FIELD_AS_IS as FIELD_AS_IS
from sessionscope._speedups._core_py import FIELD_REFUSED as FIELD_REFUSED
from sessionscope._speedups._core_py import FIELD_SORTED as FIELD_SORTED
from sessionscope._speedups._core_py import KEY_PREFIX_APP as KEY_PREFIX_APP
from sessionscope._speedups._core_py import KEY_PREFIX_TEMP as KEY_PREFIX_TEMP
from sessionscope._speedups._core_py import KEY_PREFIX_USER as KEY_PREFIX_USER
from sessionscope._speedups._core_py import MAX_DEPTH as MAX_DEPTH
from sessionscope._speedups._core_py import TEMP_PREFIX as TEMP_PREFIX
from sessionscope._speedups._core_py import USER_PREFIX as USER_PREFIX
from sessionscope._speedups._core_py import Scope as Scope

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
    "pack_plain",
    "partition_by_scope",
    "partition_checked",
    "scope_of",
    "sized_key",
    "timed_record",
    "trim_temp_keys",
]

def scope_of(key: str) -> Scope: ...
def partition_by_scope(
    delta: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]: ...
def partition_checked(
    delta: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]: ...
def trim_temp_keys(delta: Mapping[str, Any]) -> dict[str, Any]: ...
def merge_scopes(
    app: Mapping[str, Any], user: Mapping[str, Any], session: Mapping[str, Any]
) -> dict[str, Any]: ...
def apply_delta(state: MutableMapping[str, Any], delta: Mapping[str, Any]) -> None: ...
def check_storable(value: object, path: str) -> None: ...
def check_delta(delta: Mapping[str, Any], root: str = "state") -> None: ...
def pack_plain(value: object, prefix: bytes = b"") -> bytes | None: ...
def pack_event(
    event: object,
    fields: tuple[str, ...],
    action_fields: tuple[str, ...],
    prefix: bytes = b"",
) -> bytes | None: ...
def pack_model(model: object, plans: dict[type, Any], prefix: bytes = b"") -> bytes | None: ...
def sortable_time(timestamp: float) -> bytes: ...
def revision_marker(number: int, count: int, removed: int) -> str: ...
def timed_record(timestamp: float, record: bytes) -> bytes: ...
def sized_key(prefix: bytes, text: str, limit: int) -> bytes | None: ...
def last_values(records: list[bytes], prefix: bytes, key: str) -> bytes | None: ...
