"""How google-adk ``Event`` objects become stored records and back, fast.

Write: ``model_dump`` in python mode, by alias, without ``None`` fields. Bytes
stay bytes (msgpack has a binary type), so nothing takes a base64 detour.
Aliases are needed because the auth schemes inside
``actions.requested_auth_configs`` only validate by alias; that field is typed
``Any`` at runtime, so its models dump with plain ``Enum`` members, which are
not storable: it alone is dumped in JSON mode (it holds no bytes).

A record of plain values (the common one) is checked and packed in one walk
(``pack_plain``); any other is checked, naming a bad value by its path, and
packed by msgpack: the same bytes either way.

Read: ``Event.model_validate`` on the decoded map, pydantic's public path
(see "Internals kept, and why" in docs/ARCHITECTURE.md for what a faster one cost).
"""

from __future__ import annotations

from typing import Any

from google.adk.events import Event

from .. import codec
from ..core import pack_plain
from ..errors import IncompatibleStoreError
from ..service.core import not_of_kind

__all__ = ["decode_events", "encode_event", "event_from_record"]

_AUTH_CONFIGS = "requestedAuthConfigs"
_PREFIX = codec.EVENT_FORMAT
_PREFIX_BYTES = bytes([_PREFIX])


def _dump_options() -> dict[str, Any]:
    """Return the model_dump options that drop no information for Event.

    Leaving out ``None`` fields is exact only while no nullable field has a
    default other than ``None``; otherwise fall back to leaving out defaults.
    """
    if _nullable_with_default(Event.__pydantic_core_schema__):
        return {"by_alias": True, "exclude_defaults": True}
    return {"by_alias": True, "exclude_none": True}


def _nullable_with_default(node: Any) -> bool:
    if isinstance(node, list):
        return any(_nullable_with_default(item) for item in node)
    if not isinstance(node, dict):
        return False
    if node.get("type") == "model-field":
        inner = node["schema"]
        if (
            inner.get("type") == "default"
            and inner["schema"].get("type") == "nullable"
            and ("default_factory" in inner or inner.get("default") is not None)
        ):
            return True
    return any(_nullable_with_default(value) for value in node.values())


_DUMP = _dump_options()
# What Event.model_dump calls, without the Python frame around it (about 0.4 us).
_to_python = Event.__pydantic_serializer__.to_python


def encode_event(event: Event) -> bytes:
    """Return the stored record of an ADK event; unstorable values raise TypeError."""
    # pydantic would dump an object of another class with a warning (this
    # package's own Event has the same fields): refused instead.
    if not isinstance(event, Event):
        raise not_of_kind("event", event, Event)
    record = _to_python(event, **_DUMP)
    actions = record.get("actions")
    # Dumped as an empty map when there is none: nothing to redo then.
    if actions and actions.get(_AUTH_CONFIGS):
        actions[_AUTH_CONFIGS] = {
            key: _jsonable(value) for key, value in event.actions.requested_auth_configs.items()
        }
    stored = pack_plain(record, _PREFIX_BYTES)
    if stored is None:
        stored = codec.encode_event(record, "event")
    return stored


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", **_DUMP)
    return value


# -- read -----------------------------------------------------------------


_validate = Event.model_validate


def event_from_record(record: Any) -> Event:
    """Return the ADK event of a decoded record map."""
    return _validate(record)


def decode_events(records: list[bytes]) -> list[Event]:
    """Return the ADK events stored as ``records``."""
    validate = _validate
    decode = codec.decode_stored
    events = []
    for data in records:
        if not data or data[0] != _PREFIX:
            codec.decode_event(data)  # raises the format error
            raise IncompatibleStoreError("unreadable event record")
        fields = decode(memoryview(data)[1:], "an event record")
        try:
            events.append(validate(fields))
        except (TypeError, ValueError, AttributeError) as error:
            raise codec.unreadable_event(error) from error
    return events
