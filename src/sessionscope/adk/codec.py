"""How google-adk ``Event`` objects become stored records and back, fast.

Write: ``model_dump`` in python mode, by alias, without ``None`` fields. Bytes
stay bytes (msgpack has a binary type), so nothing takes a base64 detour.
Aliases are needed because the auth schemes inside
``actions.requested_auth_configs`` only validate by alias; that field is typed
``Any`` at runtime, so its models dump with plain ``Enum`` members, which are
not storable: it alone is dumped in JSON mode (it holds no bytes).

Read: building pydantic objects is most of a read. Validating the decoded map
with ``Event.model_validate`` spends more than half its time in Python hooks
that do nothing for a map this module wrote: google-genai's
``_check_field_type_mismatches`` on every genai model (it only warns about
model instances of the wrong class, and a decoded map holds none), ADK's
``Event._accept_convenience_kwargs`` (it routes keyword arguments that are not
fields, and a dump holds fields only) and ``Part.__init__`` (with keyword
arguments only it just forwards them). pydantic-core reuses a class's own
prebuilt validator for every ``model`` node, so those hooks cannot simply be
dropped from a copied schema: each ``model`` node is replaced by its
``model-fields`` validator followed by a small constructor, the way
``model_construct`` builds an instance. The result is checked against
``model_validate`` on sample events when it is built, and the plain path is
used if anything differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.adk.events import Event
from pydantic_core import PydanticUndefined, SchemaValidator

from .. import codec
from ..errors import IncompatibleStoreError

__all__ = ["decode_events", "encode_event", "event_from_record", "validator_kind"]

_AUTH_CONFIGS = "requestedAuthConfigs"
_PREFIX = codec.EVENT_FORMAT
_set = object.__setattr__
_new = object.__new__
_ATOMIC = frozenset({type(None), bool, int, float, str, bytes})


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
    record = _to_python(event, **_DUMP)
    actions = record.get("actions")
    if actions and _AUTH_CONFIGS in actions:
        actions[_AUTH_CONFIGS] = {
            key: _jsonable(value) for key, value in event.actions.requested_auth_configs.items()
        }
    return codec.encode_event(record, "event")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", **_DUMP)
    return value


# -- read -----------------------------------------------------------------


def _noop_hooks() -> set[Any]:
    hooks: set[Any] = {Event._accept_convenience_kwargs.__func__}
    try:
        from google.genai import _common

        hooks.add(_common.BaseModel._check_field_type_mismatches.__func__)
    except (ImportError, AttributeError):
        pass
    return hooks


def _function_of(node: dict[str, Any]) -> Any:
    function = node.get("function")
    if isinstance(function, dict):
        function = function.get("function")
    return getattr(function, "__func__", function)


def _constructor(cls: Any, post_init: bool) -> Callable[[tuple[Any, Any, Any]], Any]:
    """Return what turns a model-fields result into an instance of ``cls``."""
    private: dict[str, Any] = getattr(cls, "__private_attributes__", {})
    # pydantic's own post-init only sets private attributes, done here already.
    own_post_init = post_init and cls.model_post_init.__name__ != "init_private_attributes"
    # Private defaults without a factory are copied from a template: faster
    # than asking each attribute, and immutable in every model seen so far.
    template: dict[str, Any] | None = None
    if private and all(
        attr.default_factory is None and type(attr.default) in _ATOMIC for attr in private.values()
    ):
        template = {name: attr.default for name, attr in private.items()}

    def private_values() -> dict[str, Any] | None:
        if template is not None:
            return template.copy()
        if not private:
            return None
        values = {}
        for name, attr in private.items():
            default = attr.get_default(call_default_factory=True)
            if default is not PydanticUndefined:
                values[name] = default
        return values

    if not private and not own_post_init:

        def build_plain(parts: tuple[Any, Any, Any]) -> Any:
            instance = _new(cls)
            _set(instance, "__dict__", parts[0])
            _set(instance, "__pydantic_fields_set__", parts[2])
            _set(instance, "__pydantic_extra__", parts[1])
            _set(instance, "__pydantic_private__", None)
            return instance

        return build_plain

    def build(parts: tuple[Any, Any, Any]) -> Any:
        instance = _new(cls)
        _set(instance, "__dict__", parts[0])
        _set(instance, "__pydantic_fields_set__", parts[2])
        _set(instance, "__pydantic_extra__", parts[1])
        _set(instance, "__pydantic_private__", private_values())
        if own_post_init:
            instance.model_post_init(None)
        return instance

    return build


def _rewrite(node: Any, hooks: set[Any]) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, hooks) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "function-before" and _function_of(node) in hooks:
        return _rewrite(node["schema"], hooks)
    out = {key: _rewrite(value, hooks) for key, value in node.items()}
    if kind == "model" and not out.get("root_model") and out["schema"]["type"] == "model-fields":
        fields = dict(out["schema"])
        extra = out.get("config", {}).get("extra_fields_behavior")
        if extra:
            fields["extra_behavior"] = extra
        build = _constructor(out["cls"], bool(out.get("post_init")))
        wrapper = {
            "type": "function-after",
            "function": {"type": "no-info", "function": build},
            "schema": fields,
        }
        if "ref" in out:
            wrapper["ref"] = out["ref"]
        return wrapper
    return out


def _fast_validator() -> Callable[[Any], Event] | None:
    """Return the fast event builder, or None if it does not match model_validate."""
    try:
        schema = _rewrite(Event.__pydantic_core_schema__, _noop_hooks())
        # Every model of the tree validates by alias and by name; with the
        # model nodes gone, this config reaches each model-fields validator.
        validator = SchemaValidator(schema, {"validate_by_alias": True, "validate_by_name": True})
        for sample in _samples():
            record = codec.decode_event(encode_event(sample))
            built = validator.validate_python(record)
            plain = Event.model_validate(codec.decode_event(encode_event(sample)))
            if (
                type(built) is not Event
                or built != plain
                or built.model_dump() != sample.model_dump()
            ):
                return None
    except Exception:  # any surprise in a pydantic internals shape: use the plain path
        return None
    result: Callable[[Any], Event] = validator.validate_python
    return result


def _samples() -> list[Event]:
    from google.genai import types

    return [
        Event(id="s1", author="user", timestamp=1.0),
        Event(
            id="s2",
            invocation_id="i",
            author="agent",
            timestamp=2.5,
            branch="a.b",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="hi"),
                    types.Part(inline_data=types.Blob(mime_type="x/y", data=b"\x00\xff")),
                    types.Part(function_call=types.FunctionCall(id="c", name="f", args={"a": 1})),
                ],
            ),
            usage_metadata=types.GenerateContentResponseUsageMetadata(total_token_count=3),
            long_running_tool_ids={"c"},
            custom_metadata={"k": [1, None]},
        ),
    ]


_fast = _fast_validator()
_validate: Callable[[Any], Event] = _fast if _fast is not None else Event.model_validate


def validator_kind() -> str:
    """Return which event builder is in use: ``"fast"`` or ``"model_validate"``."""
    return "fast" if _fast is not None else "model_validate"


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
