"""The ADK codec's fast write path: ``pack_model`` packs what pydantic's dump would be.

``sessionscope.adk.codec`` packs an event straight from its models' field
values, by plans made from the classes' schemas, and falls back to the dump
wherever a plan cannot match it. Each test holds that path to the dump's
bytes, on both builds of the core, and shows where it must give way.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events import Event, EventActions
from google.genai import types
from pydantic import BaseModel, ConfigDict, computed_field, field_serializer, model_serializer

from _adk_helpers import dumped_record, realistic_event, rich_event
from sessionscope import codec
from sessionscope.adk import codec as adk_codec

pytestmark = pytest.mark.adk

PREFIX = bytes([codec.EVENT_FORMAT])


def _dump_bytes(event: Event) -> bytes:
    """Return the stored bytes of pydantic's dump of an event (see dumped_record)."""
    return codec.encode_event(dumped_record(event))


# Events the fast path packs: every field and serializer it follows.
PACKED: dict[str, Any] = {
    "realistic": lambda: realistic_event(7),
    "text_only": lambda: Event(
        author="user", content=types.Content(role="user", parts=[types.Part(text="hi")])
    ),
    "function_response": lambda: Event(
        author="tool",
        content=types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(
                        id="c1", name="f", response={"rows": [{"a": 1, "b": [None, 2.5]}]}
                    )
                )
            ],
        ),
    ),
    "bytes_and_signature": lambda: Event(
        author="m",
        content=types.Content(
            role="model",
            parts=[
                types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG\x00")),
                types.Part(text="t", thought=True, thought_signature=b"\x01\x02"),
            ],
        ),
    ),
    # A set, packed sorted as Event's own serializer sorts it.
    "long_running_tool_ids": lambda: Event(author="a", long_running_tool_ids={"b", "c", "a"}),
    # The state maps' wrap serializers keep a plain map as it is, None values included.
    "state_delta": lambda: Event(
        author="a",
        actions=EventActions(state_delta={"k": None, "user:n": {"x": [1, None]}, "app:f": 0.5}),
    ),
    "agent_state": lambda: Event(author="a", actions=EventActions(agent_state={"step": 2})),
    # str enum members pack as their text, as msgpack packs them from the dump.
    "enums": lambda: Event(
        author="m",
        finish_reason=types.FinishReason.STOP,
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=3,
            prompt_tokens_details=[
                types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=3)
            ],
        ),
    ),
    "more_than_fifteen_fields": lambda: realistic_event(
        1,
        branch="root.a",
        partial=False,
        turn_complete=True,
        interrupted=False,
        error_code="E",
        error_message="m",
        custom_metadata={"k": 1},
        finish_reason=types.FinishReason.STOP,
        model_version="v1",
        avg_logprobs=-0.25,
        long_running_tool_ids={"x"},
    ),
}


@pytest.mark.parametrize("name", sorted(PACKED))
def test_the_fast_path_packs_the_dump_on_both_builds(core_impl: ModuleType, name: str) -> None:
    """Each build packs these events itself, into the bytes of pydantic's dump."""
    event = PACKED[name]()
    packed = core_impl.pack_model(event, adk_codec._PLANS, PREFIX)
    assert packed is not None, "the fast path gave way on an event it should pack"
    assert packed == _dump_bytes(event)
    assert adk_codec.encode_event(event) == packed


def test_the_agent_mix_takes_the_fast_path(core_impl: ModuleType) -> None:
    """Every event of a slice of the mix is packed by the plan, to the dump's bytes."""
    from sessionscope.bench.speed import Workload, mix_spec

    work = Workload.of(mix_spec(6, seed=5))
    assert work.appends
    for _, record, _ in work.appends:
        event = Event.model_validate(record)
        packed = core_impl.pack_model(event, adk_codec._PLANS, PREFIX)
        assert packed is not None
        assert packed == _dump_bytes(event)


# Events the fast path must leave to the dump, with why.
GIVEN_WAY: dict[str, Any] = {
    # A tuple is storable but not plain: the dump's general path packs it.
    "tuple_in_delta": lambda: Event(author="a", actions=EventActions(state_delta={"t": (1, 2)})),
    # Auth configs are dumped in JSON mode, which only the dump does.
    "auth_configs": rich_event,
}


class _EventSubclass(Event):
    note: str = ""


@pytest.mark.parametrize("name", sorted(GIVEN_WAY))
def test_events_the_plan_cannot_match_are_dumped(core_impl: ModuleType, name: str) -> None:
    """The fast path gives None (or is not tried), and the record is still the dump's bytes."""
    event = GIVEN_WAY[name]()
    if name != "auth_configs":
        assert core_impl.pack_model(event, adk_codec._PLANS, PREFIX) is None
    assert adk_codec.encode_event(event) == _dump_bytes(event)


def test_a_subclass_of_event_has_no_plan(core_impl: ModuleType) -> None:
    """A subclass may dump otherwise: the plans name exact classes only."""
    event = _EventSubclass(author="a", note="n")
    assert core_impl.pack_model(event, adk_codec._PLANS, PREFIX) is None
    assert core_impl.pack_model(Event(author="a", id="e"), adk_codec._PLANS, PREFIX) is not None


# -- plans of classes that are not ADK's ---------------------------------------------


class _Leaf(BaseModel):
    model_config = ConfigDict(alias_generator=lambda name: name.upper(), populate_by_name=True)
    text: str | None = None
    count: int = 0


class _Serialized(BaseModel):
    plain: int = 1
    shown: str | None = None

    @field_serializer("shown")
    def _shout(self, value: str | None) -> str | None:
        return None if value is None else value.upper()


class _WithModelSerializer(BaseModel):
    a: int = 1

    @model_serializer
    def _whole(self) -> dict[str, Any]:
        return {"other": self.a}


class _WithComputed(BaseModel):
    a: int = 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.a


class _Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int = 1


class _Root(BaseModel):
    leaf: _Leaf | None = None
    leaves: list[_Leaf] = []
    serialized: _Serialized | None = None
    whole: _WithModelSerializer | None = None
    computed: _WithComputed | None = None
    extra: _Extra | None = None
    hidden: str = ""

    def model_post_init(self, context: Any) -> None:
        pass


def _root_bytes(model: BaseModel) -> bytes:
    return codec.pack(model.model_dump(by_alias=True, exclude_none=True))


def test_plans_are_made_only_where_the_dump_is_matched() -> None:
    """Serializers, computed and extra fields leave a class without a plan, or a field refused."""
    plans = adk_codec._plans(_Root)
    assert set(plans) == {_Root, _Leaf, _Serialized}
    # Aliases come from the schema; a field with an unknown serializer is refused when set.
    assert plans[_Leaf] == (("text", "TEXT", 0), ("count", "COUNT", 0))
    assert dict((name, how) for name, _, how in plans[_Serialized]) == {"plain": 0, "shown": 2}


def test_a_planned_model_packs_its_dump_and_gives_way_where_it_must(core_impl: ModuleType) -> None:
    plans = adk_codec._plans(_Root)
    model = _Root(leaf=_Leaf(text="t"), leaves=[_Leaf(count=2), _Leaf()], serialized=_Serialized())
    assert core_impl.pack_model(model, plans) == _root_bytes(model)
    # The refused field, set: only pydantic runs its serializer.
    assert core_impl.pack_model(_Root(serialized=_Serialized(shown="x")), plans) is None
    for unplanned in (
        _Root(whole=_WithModelSerializer()),
        _Root(computed=_WithComputed()),
        _Root(extra=_Extra(b=2)),
    ):
        assert core_impl.pack_model(unplanned, plans) is None
    # A model the plans do not name at all, and a value that is not plain.
    assert core_impl.pack_model(_Leaf(), {}) is None
    assert core_impl.pack_model(_Root(leaf=_Leaf(text="\ud800")), plans) is None


def test_nesting_deeper_than_plain_packing_gives_way(core_impl: ModuleType) -> None:
    """The same depth limit as pack_plain, on both builds."""
    plans = {_Holder: (("value", "value", 0),)}
    shallow: Any = 1
    for _ in range(62):
        shallow = [shallow]
    assert core_impl.pack_model(_Holder(value=shallow), plans) == codec.pack({"value": shallow})
    deep: Any = [shallow]
    assert core_impl.pack_model(_Holder(value=[deep]), plans) is None
    # A leaf below the deepest list packs, a str enum member as its text.
    leaf: Any = types.MediaModality.TEXT
    for _ in range(63):
        leaf = [leaf]
    expected: Any = "TEXT"
    for _ in range(63):
        expected = [expected]
    assert core_impl.pack_model(_Holder(value=leaf), plans) == codec.pack({"value": expected})


class _Holder(BaseModel):
    value: Any = None


def test_bad_arguments_are_type_errors(core_impl: ModuleType) -> None:
    """The same TypeError from both builds, for the model itself or one nested in it."""
    with pytest.raises(TypeError, match="prefix must be bytes"):
        core_impl.pack_model(_Leaf(), {_Leaf: ()}, "x")
    with pytest.raises(TypeError, match="plans must be a dict"):
        core_impl.pack_model(_Leaf(), [(_Leaf, ())])
    good = (("text", "text", 0),)
    for plan in (
        [("text", "text", 0)],  # a list, not a tuple
        (["text", "text", 0],),
        (("text", "text"),),
        (("text", b"text", 0),),  # a serialization name that is not str
        (("text", "text", 1.0),),
        (("text", "text", 3),),
        (("text", "text", 2**70),),
    ):
        with pytest.raises(TypeError, match="plans must map classes to tuples"):
            core_impl.pack_model(_Leaf(text="t"), {_Leaf: plan})
        with pytest.raises(TypeError, match="plans must map classes to tuples"):
            nested = {_Holder: (("value", "v", 0),), _Leaf: plan}
            core_impl.pack_model(_Holder(value=_Leaf()), nested)
    assert core_impl.pack_model(_Leaf(text="t"), {_Leaf: good}) == codec.pack({"text": "t"})


def test_a_map_of_more_than_a_map16_gives_way(core_impl: ModuleType) -> None:
    """A plan of more set fields than a map16 counts gives None on both builds."""
    many = {f"f{n}": n for n in range(0x10000)}
    holder = _Holder()
    vars(holder).update(many)
    plan = tuple((name, name, 0) for name in many)
    assert core_impl.pack_model(holder, {_Holder: plan}) is None
    assert core_impl.pack_model(holder, {_Holder: plan[:0xFFFF]}) == codec.pack(
        dict(list(many.items())[:0xFFFF])
    )
