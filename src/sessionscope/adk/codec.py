"""How google-adk ``Event`` objects become stored records and back, fast.

Write: ``model_dump`` in python mode, by alias, without ``None`` fields. Bytes
stay bytes (msgpack has a binary type), so nothing takes a base64 detour.
Aliases are needed because the auth schemes inside
``actions.requested_auth_configs`` only validate by alias; that field is typed
``Any`` at runtime, so its models dump with plain ``Enum`` members, which are
not storable: it alone is dumped in JSON mode (it holds no bytes).

The dump costs more than the rest of an append (pydantic serializes every
one of Event's 35 fields, and each Part's 17, through its per-field
machinery), so the common event skips it: ``pack_model`` packs the map the
dump would be straight from the models' field values, by a plan per model
class made here once from each class's public schema (see ``_plans``). A
class whose dump the plan cannot match (a model or field serializer not known
here, computed or extra fields), a value that is not plain, or a model of a
class without a plan, makes it give None, and the event takes the dump.

A dumped record of plain values is checked and packed in one walk
(``pack_plain``); any other is checked, naming a bad value by its path, and
packed by msgpack: the same bytes either way.

Read: ``Event.model_validate`` on the decoded map, pydantic's public path
(see "Internals kept, and why" in docs/ARCHITECTURE.md for what a faster one cost).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.adk.events import Event
from google.adk.events.event_actions import EventActions

from .. import codec
from ..core import FIELD_AS_IS, FIELD_REFUSED, FIELD_SORTED, pack_model, pack_plain
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

# The fields of ADK's own classes whose serializers pack_model can follow,
# by what each does to a plain value: the event's long-running tool ids
# become a sorted list; the wrap serializers of the state maps hand a plain
# map to pydantic's own serialization, which keeps it as it is.
# tests/test_adk_model_packing.py holds each to the dump, so a change in ADK shows.
_KNOWN_SERIALIZERS: dict[tuple[type, str], int] = {
    (Event, "long_running_tool_ids"): FIELD_SORTED,
    (EventActions, "state_delta"): FIELD_AS_IS,
    (EventActions, "agent_state"): FIELD_AS_IS,
}


def _plans(root: type) -> dict[type, tuple[tuple[str, str, int], ...]]:
    """Return pack_model's plan of each model class reachable from ``root``'s schema.

    Read from the classes' core schemas (``__pydantic_core_schema__``) and
    ``model_fields``: a plan lists a class's fields in the dump's order with
    their serialization names. A class gets none where its dump could differ
    from what the plan packs: a model serializer, computed fields, extra
    fields kept, a field serialized by a function not in _KNOWN_SERIALIZERS
    (such a field may still be unset) or left out by a condition. Without
    ``exclude_none`` (see _dump_options) no class gets one.
    """
    if _DUMP.get("exclude_none") is not True:
        return {}
    schema: Any = getattr(root, "__pydantic_core_schema__", {})
    definitions = {
        node["ref"]: node
        for node in schema.get("definitions", ())
        if isinstance(node, dict) and "ref" in node
    }
    plans: dict[type, tuple[tuple[str, str, int], ...]] = {}
    for node in _model_nodes(schema):
        cls = node["cls"]
        if cls not in plans:
            plan = _plan(cls, node, definitions)
            if plan is not None:
                plans[cls] = plan
    return plans


def _model_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Yield every model node of a core schema."""
    if isinstance(node, dict):
        if node.get("type") == "model" and isinstance(node.get("cls"), type):
            yield node
        for value in node.values():
            yield from _model_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _model_nodes(value)


def _plan(
    cls: type, node: dict[str, Any], definitions: dict[str, Any]
) -> tuple[tuple[str, str, int], ...] | None:
    if "serialization" in node or node.get("config", {}).get("extra_fields_behavior") == "allow":
        return None
    fields_node = node.get("schema")
    while isinstance(fields_node, dict) and fields_node.get("type") != "model-fields":
        fields_node = fields_node.get("schema")
    if not isinstance(fields_node, dict) or fields_node.get("computed_fields"):
        return None
    fields = fields_node["fields"]
    model_fields = getattr(cls, "model_fields", None)
    if not isinstance(model_fields, dict) or list(fields) != list(model_fields):
        return None
    plan: list[tuple[str, str, int]] = []
    for name, field in fields.items():
        if field.get("serialization_exclude") or model_fields[name].exclude:
            continue
        if "serialization_exclude_if" in field:
            return None
        how = FIELD_AS_IS
        if _serialized_by_function(field["schema"], definitions, set()):
            how = _KNOWN_SERIALIZERS.get((cls, name), FIELD_REFUSED)
        plan.append((name, field.get("serialization_alias") or name, how))
    return tuple(plan)


def _serialized_by_function(node: Any, definitions: dict[str, Any], seen: set[str]) -> bool:
    """Return whether a field's schema serializes its value otherwise than by its type.

    A nested model has a plan of its own (or none), so the walk stops there.
    """
    if isinstance(node, list):
        return any(_serialized_by_function(item, definitions, seen) for item in node)
    if not isinstance(node, dict) or node.get("type") == "model":
        return False
    if "serialization" in node:
        return True
    if node.get("type") == "definition-ref":
        ref = node.get("schema_ref")
        if ref in seen:
            return False  # walked already, or being walked
        if ref not in definitions:
            return True  # not found: taken as the worst case
        seen.add(ref)
        return _serialized_by_function(definitions[ref], definitions, seen)
    return any(
        _serialized_by_function(value, definitions, seen)
        for key, value in node.items()
        if key != "metadata"
    )


_PLANS = _plans(Event)
# What Event.model_dump calls, without the Python frame around it (about 0.4 us).
_to_python = Event.__pydantic_serializer__.to_python


def encode_event(event: Event) -> bytes:
    """Return the stored record of an ADK event; unstorable values raise TypeError."""
    # pydantic would dump an object of another class with a warning (this
    # package's own Event has the same fields): refused instead.
    if not isinstance(event, Event):
        raise not_of_kind("event", event, Event)
    actions = event.actions
    # Auth configs are dumped in JSON mode (see above): only the dump does that.
    if actions is None or not actions.requested_auth_configs:
        stored = pack_model(event, _PLANS, _PREFIX_BYTES)
        if stored is not None:
            return stored
    record = _to_python(event, **_DUMP)
    dumped = record.get("actions")
    # Dumped as an empty map when there is none: nothing to redo then.
    if dumped and dumped.get(_AUTH_CONFIGS):
        dumped[_AUTH_CONFIGS] = {
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
