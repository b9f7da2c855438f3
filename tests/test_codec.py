"""The codec: what values and events become as bytes, and what it refuses."""

from __future__ import annotations

import math
import threading

import msgpack
import pytest

from sessionscope import codec
from sessionscope.errors import CorruptStoreError, IncompatibleStoreError, StateValueError

NESTED = {
    "none": None,
    "flag": True,
    "small": -(2**63),
    "big": 2**64 - 1,
    "float": 1.5,
    "text": "héllo\x00wörld",
    "raw": b"\x00\xff bytes",
    "list": [1, "two", [3.0, None]],
    "map": {"inner": {"deeper": [b"x", {"k": False}]}},
}


def test_values_round_trip_with_their_types() -> None:
    data = codec.encode_value(NESTED, "state['v']")
    back = codec.decode_value(data)
    assert back == NESTED
    assert type(back["raw"]) is bytes and type(back["text"]) is str
    assert type(back["flag"]) is bool and type(back["float"]) is float


def test_tuples_come_back_as_lists() -> None:
    assert codec.decode_value(codec.encode_value((1, (2, 3)), "state['t']")) == [1, [2, 3]]


def test_unpack_keeps_the_options_stored_bytes_need() -> None:
    # codec.unpack relies on msgpack's defaults: str as str, bytes as bytes,
    # arrays as lists, and only str or bytes map keys.
    packed = msgpack.packb({"s": "text", "b": b"raw", "a": (1, 2)}, use_bin_type=True)
    back = codec.unpack(packed)
    assert back == {"s": "text", "b": b"raw", "a": [1, 2]}
    assert type(back["s"]) is str and type(back["b"]) is bytes and type(back["a"]) is list
    with pytest.raises(ValueError):
        codec.unpack(msgpack.packb({1: "int key"}))


def test_nan_and_infinities_are_floats() -> None:
    back = codec.decode_value(codec.encode_value([math.inf, -math.inf, math.nan], "v"))
    assert back[:2] == [math.inf, -math.inf] and math.isnan(back[2])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"cart": [1, 2, {3}]}, r"state\['v'\]\['cart'\]\[2\]: set is not storable"),
        (frozenset(), r"state\['v'\]: frozenset is not storable"),
        (object(), r"state\['v'\]: object is not storable"),
        (1j, r"state\['v'\]: complex is not storable"),
        (bytearray(b"x"), r"state\['v'\]: bytearray is not storable"),
        ({"n": 2**64}, r"state\['v'\]\['n'\]: int 18446744073709551616 is out of"),
        ({3: "x"}, r"state\['v'\]: dict key 3 is not a str"),
    ],
)
def test_unstorable_values_name_their_path(value: object, message: str) -> None:
    with pytest.raises(StateValueError, match=message) as raised:
        codec.encode_value(value, "state['v']")
    assert isinstance(raised.value, TypeError)


def test_items_are_packed_one_per_key() -> None:
    items = codec.encode_items({"a": 1, "b": [b"x"]})
    assert [key for key, _ in items] == ["a", "b"]
    assert codec.decode_values(items) == {"a": 1, "b": [b"x"]}


def test_event_records_carry_their_format() -> None:
    record = {"id": "e1", "timestamp": 1.0, "content": {"parts": [{"data": b"\x01"}]}}
    data = codec.encode_event(record)
    assert data[0] == codec.EVENT_FORMAT
    assert codec.decode_event(data) == record


def test_an_event_record_of_a_newer_format_is_refused() -> None:
    newer = bytes([codec.EVENT_FORMAT + 1]) + msgpack.packb({"id": "e1"})
    with pytest.raises(IncompatibleStoreError, match="format"):
        codec.decode_event(newer)
    with pytest.raises(IncompatibleStoreError):
        codec.decode_event(b"")


def test_an_unstorable_event_value_is_named_from_the_event() -> None:
    with pytest.raises(StateValueError, match=r"event\['content'\]: set is not storable"):
        codec.encode_event({"id": "e1", "content": {1, 2}})


def test_records_are_equal_by_content_not_key_order() -> None:
    a = codec.encode_event({"id": "e1", "author": "x"})
    b = codec.encode_event({"author": "x", "id": "e1"})
    c = codec.encode_event({"id": "e1", "author": "y"})
    assert a != b and codec.events_equal(a, b)
    assert not codec.events_equal(a, c)


def test_nothing_is_pickled() -> None:
    # A value that pickle would take and msgpack must not.
    with pytest.raises(StateValueError):
        codec.encode_value({"when": range(3)}, "state['v']")


def test_pack_after_a_failed_pack_writes_only_the_new_value() -> None:
    # The packer is kept per thread: a failure halfway must leave nothing behind.
    with pytest.raises(TypeError):
        codec.pack({"ok": [1, 2], "bad": object()})
    assert codec.pack({"a": 1}) == msgpack.packb({"a": 1}, use_bin_type=True)


def test_threads_packing_at_once_each_get_their_own_bytes() -> None:
    values = [{"thread": n, "items": list(range(n, n + 50)), "text": "x" * n} for n in range(8)]
    expected = [msgpack.packb(v, use_bin_type=True) for v in values]
    results: dict[int, list[bytes]] = {}

    def work(n: int) -> None:
        results[n] = [codec.pack(values[n]) for _ in range(2000)]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n in range(8):
        assert set(results[n]) == {expected[n]}


@pytest.mark.parametrize(
    "damaged",
    [b"\xc1", b"\xa3\xff\xfe\xfd", b"\x92\x01", b"\x81\x01\x02", b"\x01\x02"],
    ids=["never-used-byte", "invalid-utf8", "truncated-array", "int-map-key", "extra-data"],
)
def test_stored_bytes_that_do_not_decode_are_a_corrupt_store_error(damaged: bytes) -> None:
    # What every store reads back goes through these: no raw msgpack error escapes.
    with pytest.raises(CorruptStoreError, match="'cart'"):
        codec.decode_values([("cart", damaged)])
    with pytest.raises(CorruptStoreError, match="event record"):
        codec.decode_event(bytes([codec.EVENT_FORMAT]) + damaged)
    assert codec.decode_values([("cart", codec.pack([1, b"x"]))]) == {"cart": [1, b"x"]}
