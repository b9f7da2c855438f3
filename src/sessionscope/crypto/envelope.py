"""One value sealed under a data key: AES-256-GCM, bound to its place by associated data.

A sealed value is ``version (1 byte) | data-key id (4 bytes) | nonce (12) |
ciphertext and tag (16)``. The associated data names the value's place
(``place``: kind, app, user, session, event id or state key, packed as one
msgpack array), so a ciphertext copied to another place does not open.

Every nonce is a counter (96 bits: 8 random bytes drawn when a process
unwraps the key, then a 4-byte counter; the random part is drawn again when
the counter runs out and in a child process after ``fork()``), so no two
values sealed under one data key share a nonce unless two draws of 64
random bits collide. Sealing the same record twice gives other bytes: a
store recognises a retried append by its plaintext (``EncryptedStore``
hands the rules of a repeat a ``same_event`` that opens the stored record),
and compares restored state in plaintext.
"""

from __future__ import annotations

import hmac
import itertools
import os
import struct
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..codec import EVENT_FORMAT, decode_stored, pack, unpack
from ..core import pack_plain

if TYPE_CHECKING:
    from .._speedups import _no_cython as cython
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from .._speedups import _no_cython as cython

if TYPE_CHECKING:
    _new_bytes: Any = bytes
    _bytes_data: Any = bytes
elif cython.compiled:
    # A bytes object of a size, written in place before anyone else sees it:
    # a nonce or a header built in C, where struct.pack parses its format
    # and its arguments on every call (about 1,000 instructions).
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING as _bytes_data
    from cython.cimports.cpython.bytes import PyBytes_FromStringAndSize as _new_bytes

__all__ = [
    "HEADER",
    "OPENED_LIMIT",
    "SEALED_VERSION",
    "TAG",
    "Cipher",
    "Opened",
    "derive",
    "event_parts",
    "event_place",
    "key_id_of",
    "open_events",
    "open_session",
    "open_values",
    "place",
    "seal_many",
    "split",
    "state_place",
]

SEALED_VERSION = 1
_ID = struct.Struct(">BI")
_NONCE = struct.Struct(">QI")  # a counter nonce: salt, counter
_LAST_COUNT = 0xFFFFFFFF  # a counter at this value draws a new salt instead

# How many fork()s lie between the interpreter's start and this process. A
# cipher's counter carries the value it was drawn under: a child process
# must not go on counting where its parent counts, under the same salt.
_forks = 0


def _count_a_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_a_fork)


def _fresh_counter() -> tuple[int, Any, int]:
    """Return a new counter: a random salt, the count from zero, this process's forks."""
    return int.from_bytes(os.urandom(8), "big"), itertools.count(), _forks


HEADER = _ID.size + 12  # version, key id, nonce
TAG = 16
# The same two, as C integers in the compiled build.
_HEADER = cython.declare(cython.Py_ssize_t, HEADER)
_SHORTEST = cython.declare(cython.Py_ssize_t, HEADER + TAG)


def place(*parts: Any) -> bytes:
    """Return the associated data naming a value's place (kind first, then its ids)."""
    result: bytes = pack(parts)
    return result


# The msgpack headers of bins under 256 bytes (most sealed state values).
_BIN8 = [bytes((0xC4, size)) for size in range(0x100)]
_BIN16 = struct.Struct(">BH")
_BIN32 = struct.Struct(">BI")


@cython.cfunc
def _bin_head(size: cython.Py_ssize_t) -> bytes:
    """Return the msgpack header of a bin of ``size`` bytes."""
    if size < 0x100:
        head: bytes = _BIN8[size]
        return head
    if cython.compiled:
        width: cython.int = 2 if size < 0x10000 else 4
        made: bytes = _new_bytes(cython.NULL, 1 + width)
        raw: cython.p_uchar = cython.cast(cython.p_uchar, _bytes_data(made))
        raw[0] = 0xC5 if width == 2 else 0xC6
        _put_big_endian(raw + 1, size, width)
        return made
    if size < 0x10000:
        return _BIN16.pack(0xC5, size)
    return _BIN32.pack(0xC6, size)


@cython.cfunc
def _counter_nonce(salt: cython.ulonglong, number: cython.ulonglong) -> bytes:
    """Return the nonce of counter value ``number`` under ``salt``: 8 bytes, then 4, big-endian."""
    if cython.compiled:
        made: bytes = _new_bytes(cython.NULL, 12)
        raw: cython.p_uchar = cython.cast(cython.p_uchar, _bytes_data(made))
        _put_big_endian(raw, salt, 8)
        _put_big_endian(raw + 8, number, 4)
        return made
    nonce: bytes = _NONCE.pack(salt, number)
    return nonce


@cython.cfunc
def _put_big_endian(raw: cython.p_uchar, value: cython.ulonglong, width: cython.int) -> cython.int:
    """Write the low ``width`` bytes of ``value`` at ``raw``, most significant first."""
    index: cython.int
    for index in range(width - 1, -1, -1):
        raw[index] = value & 0xFF
        value >>= 8
    return 0


# A sealed event as stored is the event record ``{"id", "timestamp", "sealed"}``
# (``codec.pack_event``), built and read here piece by piece: its id and time,
# packed, are also the tail of the event's place, so neither is packed twice.
_EVENT_HEAD = bytes((EVENT_FORMAT, 0x83, 0xA2)) + b"id"
_STAMP_KEY = b"\xa9timestamp"
_SEALED_KEY = b"\xa6sealed"


def event_place(app: str, user: str, session: str) -> bytes:
    """Return the head of the places of a session's events (``place`` without id and time).

    ``event_place(a, u, s) + pack(event_id) + pack(stamp)`` is
    ``place("e", a, u, s, event_id, stamp)``: a msgpack array is its header
    and its items, packed one after the other.
    """
    return b"\x96" + pack("e") + pack(app) + pack(user) + pack(session)


@cython.cfunc
def _str_end(data: bytes, at: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """Return where the msgpack str starting at ``at`` ends; -1 when none starts there."""
    size: cython.Py_ssize_t = len(data)
    if at >= size:
        return -1
    head: cython.Py_ssize_t = data[at]
    if 0xA0 <= head <= 0xBF:
        return at + 1 + (head & 0x1F)
    if head == 0xD9 and at + 2 <= size:
        return at + 2 + data[at + 1]
    if head == 0xDA and at + 3 <= size:
        return at + 3 + (data[at + 1] << 8 | data[at + 2])
    return -1


def event_parts(data: bytes) -> tuple[bytes, int] | None:
    """Return (the packed id and time, where the sealed value starts) of a sealed event.

    Reads the record exactly as ``Cipher.seal_event`` writes it (an id
    under 64 KiB, a float time); anything else is None, and the caller
    decodes the record with msgpack instead (which also says what is wrong).
    """
    start: cython.Py_ssize_t = _sealed_start(data)
    if start < 0:
        return None
    stamp: cython.Py_ssize_t = _str_end(data, 5)
    return data[5:stamp] + data[stamp + 10 : stamp + 19], start


@cython.cfunc
def _sealed_start(data: bytes) -> cython.Py_ssize_t:
    """Return where the sealed value of a sealed event starts (``event_parts``); -1 if none."""
    size: cython.Py_ssize_t = len(data)
    if not data.startswith(_EVENT_HEAD):
        return -1
    stamp: cython.Py_ssize_t = _str_end(data, 5)
    # The time's key and value (10 + 9 bytes), the sealed value's key (7),
    # a bin header (2 to 5) and the shortest sealed value.
    if stamp < 0 or stamp + 28 + _SHORTEST > size:
        return -1
    if not data.startswith(_STAMP_KEY, stamp) or data[stamp + 10] != 0xCB:
        return -1
    end: cython.Py_ssize_t = stamp + 19
    if not data.startswith(_SEALED_KEY, end):
        return -1
    head: cython.Py_ssize_t = data[end + 7]
    start: cython.Py_ssize_t
    length: cython.Py_ssize_t
    if head == 0xC4:
        start, length = end + 9, data[end + 8]
    elif head == 0xC5:
        start, length = end + 10, data[end + 8] << 8 | data[end + 9]
    elif head == 0xC6:
        start = end + 12
        length = data[end + 8] << 24 | data[end + 9] << 16 | data[end + 10] << 8 | data[end + 11]
    else:
        return -1
    if start + length != size or length < _SHORTEST:
        return -1
    return start


def state_place(prefix: bytes, key: str) -> bytes:
    """Return the place of a state value: its map's place (a packed array) and its key."""
    return prefix + key.encode()


def derive(key: bytes, label: bytes) -> bytes:
    """Return a 32-byte key of its own for one use (``label``) of a 32-byte key."""
    return hmac.digest(key, b"sessionscope " + label, "sha256")


def key_id_of(key: bytes) -> str:
    """Return the public id of a key: 16 hex digits of an HMAC of it, never the key."""
    return derive(key, b"key id").hex()[:16]


def split(sealed: bytes) -> tuple[int, int]:
    """Return (version, data-key id) from a sealed value's header; ValueError if too short."""
    if len(sealed) < HEADER + TAG:
        raise ValueError("too short to be a sealed value")
    version, key_id = _ID.unpack_from(sealed)
    if version != SEALED_VERSION:
        raise ValueError(f"sealed with version {version}, this version reads {SEALED_VERSION}")
    return version, key_id


@cython.cfunc
def _packed(value: object) -> bytes:
    """Return the msgpack bytes of an event's id or time.

    The compiled packer of plain values first: msgpack's bytes, without a
    Python frame and a thread-local packer per call; the codec's otherwise.
    """
    packed: bytes | None = pack_plain(value)
    if packed is None:
        packed = pack(value)
    return packed


@cython.final
@cython.cclass
class Cipher:
    """One data key, ready to seal and open values: AES-256-GCM and its nonce counter.

    The key's bytes live in the ``AESGCM`` object only; ``repr`` shows the
    key id alone. ``head`` is what every value sealed under it starts with
    (version, key id).
    """

    key_id = cython.declare(object, visibility="readonly")
    head = cython.declare(bytes, visibility="readonly")
    _encrypt: Any
    _decrypt: Any
    _counter: tuple[int, Any, int]
    _lock: Any

    def __init__(self, key_id: int, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a data key is 32 bytes")
        self.key_id = key_id
        aead = AESGCM(derive(key, b"aes-256-gcm"))
        self._encrypt, self._decrypt = aead.encrypt, aead.decrypt
        self.head = _ID.pack(SEALED_VERSION, key_id)
        # The nonce of counter value n: salt (8 bytes) | n (4 bytes). Salt,
        # counter and the forks they were drawn under are one attribute,
        # replaced together.
        self._counter = _fresh_counter()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Cipher(key_id={self.key_id:#010x})"

    def seal(self, plaintext: bytes, where: bytes) -> bytes:
        """Return ``plaintext`` sealed at the place ``where``, under a counter nonce."""
        nonce = self._nonce()
        sealed: bytes = self.head + nonce + self._encrypt(nonce, plaintext, where)
        return sealed

    @cython.ccall
    def seal_items(
        self, items: list[tuple[str, bytes]], prefix: bytes, opened: Opened | None = None
    ) -> list[tuple[str, bytes]]:
        """Return state items with each value sealed at ``prefix`` and its key, as msgpack bin.

        One loop for the values of a map (what an append hands a store), so
        a value costs its AES-GCM call and little else. ``opened``, if
        given, keeps each value, so that reading it back opens nothing.
        """
        encrypt = self._encrypt
        head = self.head
        salt, count, _ = self._counting()
        sealed = []
        for key, value in items:
            number = next(count)  # atomic: itertools.count holds the GIL's promise
            nonce = _counter_nonce(salt, number) if number < _LAST_COUNT else self._nonce()
            where = prefix + key.encode()
            body: bytes = encrypt(nonce, value, where)
            whole: bytes = b"".join((head, nonce, body))
            if opened is not None:
                opened.put_value(whole, prefix, key, value)
            sealed.append((key, _bin_head(len(whole)) + whole))
        return sealed

    @cython.cfunc
    def _counting(self) -> tuple[int, Any, int]:
        """Return the counter to draw nonces from: this process's own, after a fork too."""
        counter: tuple[int, Any, int] = self._counter
        if counter[2] != _forks:
            # A child of fork(): its parent goes on with the counter it had.
            # No lock (a parent's thread may have held it across the fork);
            # threads racing here each draw a salt of their own.
            counter = _fresh_counter()
            self._counter = counter
        return counter

    @cython.ccall
    def _nonce(self) -> bytes:
        salt, count, _ = self._counting()
        number = next(count)
        if number < _LAST_COUNT:
            return _counter_nonce(salt, number)
        with self._lock:  # the counter ran out: one thread draws a new salt
            if self._counter[1] is count:
                self._counter = _fresh_counter()
        return self._nonce()

    @cython.ccall
    def seal_event(
        self,
        at: bytes,
        event_id: str,
        stamp: object,
        record: bytes,
        opened: Opened | None = None,
    ) -> bytes:
        """Return an event record as stored: its id and time, and ``record`` sealed.

        ``at`` is the session's ``event_place``. The bytes are
        ``pack_event({"id": event_id, "timestamp": stamp, "sealed": sealed})``
        with ``sealed`` that of ``seal(record, place("e", ..., event_id,
        stamp))``, built without packing the id and time twice. ``opened``,
        if given, keeps the record, so that reading it back opens nothing.
        """
        packed_id = _packed(event_id)
        packed_stamp = _packed(stamp)
        where = at + packed_id + packed_stamp
        nonce = self._nonce()
        body: bytes = self._encrypt(nonce, record, where)
        sealed: bytes = b"".join(
            (
                _EVENT_HEAD,
                packed_id,
                _STAMP_KEY,
                packed_stamp,
                _SEALED_KEY,
                _bin_head(_HEADER + len(body)),
                self.head,
                nonce,
                body,
            )
        )
        if opened is not None:
            opened.put_record(sealed, at, record)
        return sealed

    def open(self, sealed: bytes, where: bytes) -> bytes | None:
        """Return the plaintext of ``sealed`` at ``where``; None if it was altered or moved."""
        try:
            result: bytes = self._decrypt(sealed[5:HEADER], sealed[HEADER:], where)
        except InvalidTag:
            return None
        return result

    @cython.ccall
    def open_at(self, data: bytes, start: cython.Py_ssize_t, where: bytes) -> bytes | None:
        """Return the plaintext of the value sealed at ``data[start:]``; None if altered."""
        nonce_end: cython.Py_ssize_t = start + _HEADER
        try:
            result: bytes = self._decrypt(data[start + 5 : nonce_end], data[nonce_end:], where)
        except InvalidTag:
            return None
        return result


# How many bytes of sealed values and their plaintext an ``Opened`` holds by default.
OPENED_LIMIT = 16 << 20
# What an entry costs beside its bytes: its object, its slot and its key;
# and what a group's own dict costs.
_ENTRY_COST = cython.declare(cython.Py_ssize_t, 200)
_GROUP_COST = cython.declare(cython.Py_ssize_t, 400)
_TAG = cython.declare(cython.Py_ssize_t, TAG)
# What ``Opened.value`` answers for a value not met before (a state value may
# be None). Each build has its own: it never leaves this module's Opened.
MISSING: Any = object()
# Decoded values of these types are kept: no caller can change them.
_IMMUTABLE = (str, int, float, bool, bytes, type(None))
# A decoded list or map is kept too, as a copy no caller holds, when it is
# nested at most this deep; each read hands out a copy of it (a few hundred
# nanoseconds for a map of the mix, where decoding it again took about 600).
_COPY_DEPTH = cython.declare(cython.int, 32)
# What a kept list or map may cost beside its plaintext, per byte of it.
_DECODED_COST = cython.declare(cython.Py_ssize_t, 8)


@cython.final
@cython.no_gc
@cython.cclass
class _Kept:
    """What an ``Opened`` keeps of one value.

    Its objects hold bytes, immutable values and lists and maps only this
    module refers to (``_copied``), so they can take no part in a reference
    cycle: the garbage collector does not track them, nor a group's dict of
    them keyed by str or bytes, which its passes would otherwise walk entry
    by entry.
    """

    sealed: bytes
    plain: bytes
    # The state value decoded (a str, a number, a bool, bytes or None; or a
    # list or a map no caller holds, handed out as copies), or MISSING.
    value: Any
    cost: cython.Py_ssize_t


@cython.cfunc
def _kept(sealed: bytes, plain: bytes, value: Any, cost: cython.Py_ssize_t) -> _Kept:
    """Return a new ``_Kept``: made without a call of the class (its arguments unparsed)."""
    kept: _Kept = _Kept.__new__(_Kept)
    kept.sealed = sealed
    kept.plain = plain
    kept.value = value
    kept.cost = cost
    return kept


@cython.cfunc
def _is_container(head: cython.int) -> cython.bint:
    """Tell whether a msgpack value starting with byte ``head`` is an array or a map."""
    return 0x80 <= head <= 0x9F or 0xDC <= head <= 0xDF


@cython.cfunc
def _copied(value: object, depth: cython.int) -> object:
    """Return a decoded value with its lists and maps copied; MISSING if nested too deep.

    Too deep: lists and maps more than ``depth`` levels down. The rest is
    shared: what msgpack decodes besides lists and maps cannot be changed.
    """
    kind = type(value)
    if kind is dict:
        if depth == 0:
            return MISSING
        items: dict[Any, Any] = {}
        for key, item in cython.cast(dict, value).items():
            copy = _copied(item, depth - 1)
            if copy is MISSING:
                return MISSING
            items[key] = copy
        return items
    if kind is list:
        if depth == 0:
            return MISSING
        copies: list[Any] = []
        for item in cython.cast(list, value):
            copy = _copied(item, depth - 1)
            if copy is MISSING:
                return MISSING
            copies.append(copy)
        return copies
    return value


@cython.final
@cython.cclass
class Opened:
    """Values sealed or opened lately, so that reading one again costs no AES-GCM call.

    An agent reads back, turn after turn, the events and state it has just
    written or read. One ``Opened`` keeps events (``record``,
    ``put_record``: found by their session's place and the GCM tag, the
    sealed record's last 16 bytes), another state values (``value``,
    ``put_value``: found by their map's place and their key, so a value set
    again replaces the one before). Entries are grouped by the place of
    their session or map, so that a read of one finds its values in one
    small dict, by the key it holds already, without building each value's
    place. An entry serves only the very same sealed bytes at the very same
    place: a value altered, moved or not met before goes through AES-GCM,
    which says what is wrong with it. A state value decoded to a str, a
    number, a bool, bytes or None is kept decoded; so is a list or a map
    (nested at most 32 deep), as a copy nobody else holds, and each read
    hands out a copy of it, since the caller may change what it gets.

    It holds plaintext, as the process does anyway while it works (the
    threat model in docs/encryption.md leaves a live process's memory
    out), in two generations of at most ``limit / 2`` bytes each: new
    entries go to the young one; when it is full it becomes the old one and
    the old one is dropped; an entry found in the old one moves back to the
    young one, so what is read often stays. ``clear`` drops both (on an
    erasure or a rotation).
    """

    _young: dict[bytes, dict[Any, _Kept]]
    _old: dict[bytes, dict[Any, _Kept]]
    _young_size: cython.Py_ssize_t
    _old_size: cython.Py_ssize_t
    _half: cython.Py_ssize_t

    def __init__(self, limit: int = OPENED_LIMIT) -> None:
        self._young = {}
        self._old = {}
        self._young_size = 0
        self._old_size = 0
        self._half = limit // 2

    def __repr__(self) -> str:
        count = sum(map(len, self._young.values())) + sum(map(len, self._old.values()))
        return f"Opened({count} values, about {self.size} of {2 * self._half} bytes)"

    @property
    def size(self) -> int:
        """Return about how many bytes it holds (a value in both generations counts twice)."""
        return self._young_size + self._old_size

    @cython.cfunc
    def _find(self, group: bytes, slot: object) -> _Kept | None:
        entries: dict[Any, _Kept] | None = self._young.get(group)
        if entries is not None:
            found = entries.get(slot)
            if found is not None:
                return found
        entries = self._old.get(group)
        if entries is None:
            return None
        found = entries.get(slot)
        if found is not None:
            kept: _Kept = found
            self._keep(group, slot, kept)
        return found

    @cython.cfunc
    def _keep(self, group: bytes, slot: object, kept: _Kept) -> cython.int:
        if kept.cost + _GROUP_COST > self._half:
            return 0
        entries: dict[Any, _Kept] | None = self._young.get(group)
        if entries is not None:
            replaced = entries.get(slot)
            if replaced is not None:  # a state value set again: its cost goes with it
                before: _Kept = replaced
                self._young_size -= before.cost
        if self._young_size + kept.cost + _GROUP_COST > self._half:
            self._old, self._old_size = self._young, self._young_size
            self._young, self._young_size = {}, 0
            entries = None
        if entries is None:
            entries = {}
            self._young[group] = entries
            self._young_size += _GROUP_COST
        entries[slot] = kept
        self._young_size += kept.cost
        return 0

    @cython.ccall
    def record(self, sealed: bytes, at: bytes) -> bytes | None:
        """Return the record of a sealed event met before in the session ``at``, else None."""
        size: cython.Py_ssize_t = len(sealed)
        if size < _TAG:
            return None
        found = self._find(at, sealed[size - _TAG :])
        if found is None:
            return None
        kept: _Kept = found
        if kept.sealed != sealed:
            return None
        return kept.plain

    @cython.ccall
    def put_record(self, sealed: bytes, at: bytes, plain: bytes) -> None:
        """Keep the record ``sealed`` opens to, in the session ``at`` (opened, or sealed here)."""
        size: cython.Py_ssize_t = len(sealed)
        if size < _TAG:
            return
        cost: cython.Py_ssize_t = size + len(plain) + _ENTRY_COST
        self._keep(at, sealed[size - _TAG :], _kept(sealed, plain, MISSING, cost))

    @cython.ccall
    def value(self, sealed: bytes, prefix: bytes, key: str) -> Any:
        """Return the state value sealed at ``key`` of the map ``prefix`` decoded, else MISSING."""
        found = self._find(prefix, key)
        if found is None:
            return MISSING
        kept: _Kept = found
        if kept.sealed != sealed:
            return MISSING
        value = kept.value
        if value is MISSING:
            # Its plaintext decoded when it was kept (the caller's value, or
            # one opened and decoded): msgpack's own call, not the checked one.
            value = unpack(kept.plain)
            kind = type(value)
            if kind is dict or kind is list:
                kept.value = _copied(value, _COPY_DEPTH)
            elif kind in _IMMUTABLE:
                kept.value = value
            return value
        kind = type(value)
        if kind is dict or kind is list:
            # The caller may change what it is handed: never the kept one.
            return _copied(value, _COPY_DEPTH)
        return value

    @cython.ccall
    def put_value(
        self, sealed: bytes, prefix: bytes, key: str, plain: bytes, value: Any = MISSING
    ) -> None:
        """Keep the value ``sealed`` at ``key`` of the map ``prefix`` opens to.

        (Opened, or sealed here.) ``value`` is the value decoded, if it was
        (a value sealed here is decoded when first read back).
        """
        if value is not MISSING and type(value) not in _IMMUTABLE:
            value = MISSING  # the caller's list or map: it may change it
        cost: cython.Py_ssize_t = len(sealed) + len(plain) + len(key) + _ENTRY_COST
        if plain and _is_container(plain[0]):
            cost += _DECODED_COST * len(plain)  # kept decoded once read
        self._keep(prefix, key, _kept(sealed, plain, value, cost))

    @cython.ccall
    def clear(self) -> None:
        """Forget every value."""
        self._young, self._old = {}, {}
        self._young_size = self._old_size = 0


def open_events(
    heads: Mapping[bytes, Cipher], at: bytes, records: list[bytes], opened: Opened
) -> list[bytes] | None:
    """Return the records of a session's events opened; None unless every one opens here.

    ``heads`` are the ciphers of the session's user (``Keyring.heads``),
    ``at`` its ``event_place``. A record met before is taken from
    ``opened`` (its id and time are in the record, so ``at`` is its place
    there). Any other event as ``Cipher.seal_event`` wrote it, under one
    of those keys, costs one AES-GCM call and a few slices; anything else
    (an altered or moved record, another layout, a key not unwrapped or
    erased) makes the answer None, and the caller opens the records one by
    one on the path that says what is wrong.
    """
    result = []
    start: cython.Py_ssize_t
    cipher: Cipher | None
    stamp: cython.Py_ssize_t
    for data in records:
        plain = opened.record(data, at)
        if plain is not None:
            result.append(plain)
            continue
        start = _sealed_start(data)
        if start < 0:
            return None
        cipher = heads.get(data[start : start + 5])
        if cipher is None:
            return None
        # The place: the session's head, the packed id and the packed time.
        stamp = _str_end(data, 5)
        plain = cipher.open_at(
            data, start, b"".join((at, data[5:stamp], data[stamp + 10 : stamp + 19]))
        )
        if plain is None:
            return None
        opened.put_record(data, at, plain)
        result.append(plain)
    return result


def open_values(
    heads: Mapping[bytes, Cipher], prefix: bytes, values: dict[str, Any], opened: Opened
) -> dict[str, Any] | None:
    """Return a state map's values opened and decoded; None unless every one opens here.

    ``prefix`` is the map's place; as ``open_events``, a value met before
    comes from ``opened``, and anything out of the ordinary makes the
    answer None (a value that opens but does not decode is a
    CorruptStoreError, as on the slow path).
    """
    result = {}
    cipher: Cipher | None
    for key, sealed in values.items():
        if type(sealed) is not bytes or len(sealed) < _SHORTEST:
            return None
        value = opened.value(sealed, prefix, key)
        if value is MISSING:
            cipher = heads.get(sealed[:5])
            if cipher is None:
                return None
            plain = cipher.open_at(sealed, 0, prefix + key.encode())
            if plain is None:
                return None
            value = decode_stored(plain, "a state value")
            opened.put_value(sealed, prefix, key, plain, value)
        result[key] = value
    return result


def open_session(
    user_heads: Mapping[bytes, Cipher],
    app_heads: Mapping[bytes, Cipher],
    places: tuple[bytes, ...],
    maps: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
    events: list[bytes],
    kept: tuple[Opened, Opened],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[bytes]] | None:
    """Return a session's three maps and its events opened; None unless every one opens here.

    What one read of a session opens, in one call: ``open_values`` for its
    session, app and user maps (``maps``, in that order) and
    ``open_events`` for its events. ``user_heads`` and ``app_heads`` are
    ``Keyring.heads`` of its user and its app, ``places`` the session's
    places (app, user and session maps, events' head, first), ``kept`` the
    store's ``Opened`` of events and of state values. On None the caller
    opens each map and the events on the path that says what is wrong.
    """
    opened_events, opened_values = kept
    session_state = open_values(user_heads, places[2], maps[0], opened_values)
    if session_state is None:
        return None
    app_state = open_values(app_heads, places[0], maps[1], opened_values)
    if app_state is None:
        return None
    user_state = open_values(user_heads, places[1], maps[2], opened_values)
    if user_state is None:
        return None
    records = open_events(user_heads, places[3], events, opened_events)
    if records is None:
        return None
    return session_state, app_state, user_state, records


Items = list[tuple[str, bytes]]


def seal_many(
    users: list[Cipher],
    apps: list[Cipher],
    places: list[tuple[bytes, ...]],
    owners: list[int],
    event_ids: list[str],
    timestamps: list[float],
    events: list[bytes],
    item_lists: tuple[list[Items], list[Items], list[Items]],
    kept: tuple[Opened, Opened],
    with_items: bool = True,
) -> tuple[list[bytes], list[Items], list[Items], list[Items]]:
    """Return a batch's events and state items sealed (what ``EncryptedStore`` hands down).

    Event ``n`` belongs to session ``owners[n]``, whose user's cipher is
    ``users[owner]``, its app's ``apps[owner]``, and whose places are
    ``places[owner]`` (app, user and session maps, events' head, first).
    ``item_lists`` holds the app, user and session items of every event;
    ``kept`` the store's ``Opened`` of events and of state values, which
    keep what is sealed here. Without ``with_items`` only the events are
    sealed, and the item lists come back as they were given.
    """
    app_lists, user_lists, session_lists = item_lists
    kept_events, kept_values = kept
    sealed_events: list[bytes] = []
    app_items: list[Items] = []
    user_items: list[Items] = []
    session_items: list[Items] = []
    size: cython.Py_ssize_t = len(events)
    index: cython.Py_ssize_t
    owner: cython.Py_ssize_t
    cipher: Cipher
    for index in range(size):
        owner = owners[index]
        cipher = users[owner]
        at = places[owner]
        event_id, stamp = event_ids[index], timestamps[index]
        sealed_events.append(cipher.seal_event(at[3], event_id, stamp, events[index], kept_events))
        if not with_items:
            continue
        items = app_lists[index]
        app_items.append(apps[owner].seal_items(items, at[0], kept_values) if items else items)
        items = user_lists[index]
        user_items.append(cipher.seal_items(items, at[1], kept_values) if items else items)
        items = session_lists[index]
        session_items.append(cipher.seal_items(items, at[2], kept_values) if items else items)
    if not with_items:
        return sealed_events, app_lists, user_lists, session_lists
    return sealed_events, app_items, user_items, session_items
