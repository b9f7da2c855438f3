"""A ``Session`` of the OpenAI Agents SDK on any sessionscope store (the openai-agents extra).

``AgentsSession`` keeps a conversation's items as the events of one
sessionscope session, ``(app_name, user_id, session_id)``: by default the app
``"openai-agents"`` and the user ``"default"``, so that google-adk sessions
and OpenAI Agents sessions share a store without meeting, and the retention
calls and the command line see both. Each item is one event whose content
is the item, stored as given (msgpack: bytes and nested values come back
equal; tuples as lists), and whose author is the item's role or type: the
native ``SessionService`` reads these sessions as events.

- ``get_items(limit)`` reads the last ``limit`` records, not the history.
- ``add_items(items)`` is one locked append of the whole list: one
  transaction on memory and LMDB, one server-side call on Redis (lists of
  up to 1,000 items; see docs/openai-agents.md), in order; processes adding
  to one session interleave whole lists.
- ``pop_item()`` removes the newest item in one transaction
  (``Store.pop_events``): two processes popping never get the same item.
  The newest event is read first: one that holds no item is refused and
  left where it is; one that does is popped only if it is still the
  newest (the pop's condition), else read again.
- ``clear_session()`` deletes the session; the next add creates it again,
  retrying while a clear of another process lands between its creation
  and its items.

A write (add, pop, clear) whose caller is cancelled runs to its outcome
first, then the cancellation is passed on, as the SDK's own sessions do: a
caller that times out sees the session as it is, never a write landing
later (which a retry would store twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from .codec import EVENT_FORMAT, decode_event, encode_event, unpack
from .core import IMPLEMENTATION, check_storable, last_values
from .errors import (
    AlreadyExistsError,
    CorruptStoreError,
    SessionNotFoundError,
    StaleSessionError,
    StateValueError,
    batch_stopped,
)
from .model import new_event_id
from .service.core import check_app_name, check_id
from .stores import open_store
from .stores.memory import MemoryStore
from .stores.protocol import Store
from .stores.records import AppendBatch

if TYPE_CHECKING:
    from agents.run_context import RunContextWrapper

__all__ = ["DEFAULT_APP_NAME", "DEFAULT_USER_ID", "AgentsSession"]

_log = logging.getLogger(__name__)

T = TypeVar("T")


async def _settled(write: Awaitable[T]) -> T:
    """Run a write to its outcome; a cancellation meanwhile is passed on once it is known.

    The write runs as a task of its own, which the caller's cancellation (one
    or several) does not reach; when it is done, the first cancellation is
    raised, whatever the write's outcome.
    """
    task = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as error:
            cancelled = cancelled or error
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: what the caller hears is the cancellation
        raise cancelled
    return task.result()


DEFAULT_APP_NAME = "openai-agents"
DEFAULT_USER_ID = "default"

_FORMAT_BYTE = bytes([EVENT_FORMAT])
_OTHER_API = (
    "the session was written through another API (the native service or the google-adk "
    "drop-in): give AgentsSession an app_name of its own"
)
# What an item's record is checked under; a refusal is named again from the
# item (``_refused``), so the path is built only then.
_ITEM_PATH = "item"
# How often, and how long, pop_item reads the newest event and pops it again
# when other processes keep changing the session between the two: a pop
# conditional on the newest event removes nothing when it lost.
_POP_TRIES = 1_000
_POP_SECONDS = 10.0
# How often, and how long, add_items creates its session and appends again
# when a clear of another process keeps deleting it between the two (the
# store has no append that creates a missing session in its transaction).
# Under a clear in a tight loop most rounds lose (on LMDB the clearer waits
# for the write lock and takes it as soon as the create lets go of it), so
# the rounds are many: the time bounds how long an add waits, the count the
# writes it may cost (two a round) however fast the store answers.
_CREATE_TRIES = 10_000
_CREATE_SECONDS = 10.0


class AgentsSession:
    """The OpenAI Agents SDK's ``Session`` protocol over a sessionscope store.

    ``store`` is a store object (shared by many sessions; the caller closes
    it) or a store URI (``lmdb:///path``, ``redis://host:port``,
    ``redis+cluster://...``, ``memory://``), which this session opens and
    closes; None is a new in-memory store. Every method takes the SDK's
    ``wrapper`` keyword (the run context) and ignores it. The session id's
    surrounding whitespace is stripped, as for every id of a sessionscope
    session (``"a "`` and ``"a"`` name one session).
    """

    def __init__(
        self,
        session_id: str,
        store: Store | str | None = None,
        *,
        app_name: str = DEFAULT_APP_NAME,
        user_id: str = DEFAULT_USER_ID,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str):
            raise ValueError(f"session_id must be a str, not {type(session_id).__name__}")
        self.session_id = check_id(session_id.strip(), "session_id")
        self.app_name = check_app_name(app_name)
        self.user_id = check_id(user_id, "user_id")
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._owns_store = store is None or isinstance(store, str)
        if store is None:
            store = MemoryStore()
        elif isinstance(store, str):
            store = open_store(store)
        self.store: Store = store
        self._key = (self.app_name, self.user_id, self.session_id)

    def __repr__(self) -> str:
        return (
            f"AgentsSession(session_id={self.session_id!r}, app_name={self.app_name!r}, "
            f"user_id={self.user_id!r}, store={self.store!r})"
        )

    # -- the Session protocol ----------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[Any]:
        """Return the latest ``limit`` items, oldest first (all when None).

        ``limit`` None takes ``session_settings.limit``, as the SDK resolves
        it. Only the last ``limit`` records are read. A negative limit is a
        ValueError.
        """
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None:
            if isinstance(wanted, bool) or not isinstance(wanted, int):
                raise TypeError(f"limit must be an int or None, not {type(wanted).__name__}")
            if wanted < 0:
                raise ValueError(f"limit must not be negative, got {wanted}")
            if wanted == 0:
                return []
        loaded = await self.store.aio.load_session(*self._key, wanted, None)
        if loaded is None:
            return []
        return _items_of(loaded.events)

    async def add_items(
        self, items: list[Any] | None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append ``items`` in order, all or nothing, in one write.

        Every item is checked before anything is written: an unstorable
        value is a TypeError naming it by its place in the list and the item
        (``items[2]['content']: set is not storable``), and the session is
        left as it was. None stores nothing, as an empty list, the way every
        session of the SDK takes it (``if not items: return``).
        """
        await _settled(self._add_items(items))

    async def _add_items(self, items: list[Any] | None) -> None:
        if items is None:
            return
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise TypeError(f"items must be a list of items, not {type(items).__name__}")
        items = list(items)
        if not items:
            return
        now = time.time()
        ids = [new_event_id() for _ in items]
        records = []
        for index, (event_id, item) in enumerate(zip(ids, items, strict=True)):
            record = {"id": event_id, "timestamp": now, "author": _author(item), "content": item}
            try:
                records.append(encode_event(record, _ITEM_PATH))
            except StateValueError as error:
                raise _refused(error, item, f"items[{index}]") from None
        batch = AppendBatch(
            [self._key],
            [0] * len(items),
            ids,
            [now] * len(items),
            records,
            [[] for _ in items],
            [[] for _ in items],
            [[] for _ in items],
        )
        aio = self.store.aio
        result = await aio.append_many(batch)
        tries, deadline = 0, time.monotonic() + _CREATE_SECONDS
        while isinstance(result.error, SessionNotFoundError) and result.applied == 0:
            if tries == _CREATE_TRIES or time.monotonic() > deadline:
                break
            tries += 1
            # The first add, or the first after a clear: create the session
            # (another add may have done it meanwhile) and append again; a
            # clear landing between the two sends the round again.
            with contextlib.suppress(AlreadyExistsError):
                await aio.create_session(*self._key, now, [], [], [])
            result = await aio.append_many(batch)
        if result.error is not None:
            if result.applied:
                _log.warning(
                    "add_items stored %d of %d items of session %r before an error",
                    result.applied,
                    len(items),
                    self.session_id,
                )
            raise batch_stopped(result.error, result.applied, len(items))

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> Any | None:
        """Remove and return the newest item (None when there is none), atomically.

        An event that holds no item (written through the native API, or
        damaged) is refused with CorruptStoreError and left where it is: the
        newest event is read first, and removed only when it is an item and
        still the newest, a condition the store checks in the pop's own
        transaction. Another writer changing the session in between costs a
        new read, never an event: after ``_POP_TRIES`` rounds (or
        ``_POP_SECONDS``) lost that way in a row, StaleSessionError.
        """
        return await _settled(self._pop_item())

    async def _pop_item(self) -> Any | None:
        aio = self.store.aio
        tries, deadline = 0, time.monotonic() + _POP_SECONDS
        while True:
            loaded = await aio.load_session(*self._key, 1, None)
            if loaded is None or not loaded.events:
                return None
            newest = loaded.events[-1]
            fields = _fields_of(newest, "the newest event")
            event_id = fields.get("id")
            if not isinstance(event_id, str):
                raise CorruptStoreError(
                    "the newest event of this session has no id",
                    "it was altered outside sessionscope: delete the session or restore it "
                    "from a copy",
                )
            try:
                popped = await aio.pop_events(*self._key, 1, if_last_event_id=event_id)
            except SessionNotFoundError:  # cleared since the read
                return None
            except StaleSessionError:
                # Another process appended or popped since the read: nothing
                # was removed. The newest event is read again and checked again.
                tries += 1
                if tries == _POP_TRIES or time.monotonic() > deadline:
                    raise StaleSessionError(
                        f"pop_item of session {self.session_id!r} found its newest event "
                        f"changed by other writers {tries} times in a row: nothing was removed"
                    ) from None
                continue
            # The newest event was the one read and checked: its id says so.
            return fields["content"] if popped[0] == newest else _item_of(popped[0])

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Remove every item of this session; other sessions stay as they are."""
        await _settled(self.store.aio.delete_session(*self._key))

    # -- lifetime ----------------------------------------------------------

    async def close(self) -> None:
        """Close the store if this session opened it (from a URI or None); else do nothing."""
        if self._owns_store:
            await self.store.aio.close()

    async def __aenter__(self) -> AgentsSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _author(item: Any) -> str:
    """Return who an item is from, for the command line: its role, else its type."""
    if isinstance(item, Mapping):
        for field in ("role", "type"):
            value = item.get(field)
            if isinstance(value, str):
                return value
    return ""


def _refused(error: StateValueError, item: Any, path: str) -> StateValueError:
    """Return the error of an unstorable item, naming the value by its place in the item.

    The check walked the item's record, whose path runs through the
    record's own fields (``['content']``); the item is walked again here,
    only once refused, so that the path is the caller's. Only nesting can
    pass on its own and fail in the record, one level deeper: that message
    keeps its place with the record's field left out.
    """
    try:
        check_storable(item, path)
    except StateValueError as named:
        return named
    message = str(error)
    inner = _ITEM_PATH + "['content']"
    if message.startswith(inner):
        message = path + message[len(inner) :]
    return StateValueError(message)


def _items_of(records: list[bytes]) -> list[Any]:
    """Return the items stored records hold, in order.

    Decoding is most of what reading twenty items costs, so it is done in
    one call. The compiled core's ``last_values`` walks the records without
    decoding them and gathers the bytes under ``content``, the last entry of
    the records ``add_items`` writes: only the items are decoded. (Walking
    in Python costs more than decoding whole records, so the pure core
    decodes the records, as one msgpack array.) Any record laid out
    otherwise, or that does not unpack, is decoded on its own, which says
    what is wrong.
    """
    try:
        if IMPLEMENTATION == "c":
            contents = last_values(records, _FORMAT_BYTE, "content")
            if contents is not None:
                items: list[Any] = unpack(contents)
                return items
        elif all(record[:1] == _FORMAT_BYTE for record in records):
            # The records' maps, as one msgpack array (a 32-bit count fits any).
            head = b"\xdd" + len(records).to_bytes(4, "big")
            fields = unpack(head + b"".join([memoryview(record)[1:] for record in records]))
            if all(type(f) is dict and "content" in f for f in fields):
                return [f["content"] for f in fields]
    except Exception:  # decoded one by one below, which names the damage
        pass
    return [_item_of(record) for record in records]


def _item_of(record: bytes) -> Any:
    """Return the item a stored event record holds."""
    return _fields_of(record, "an event")["content"]


def _fields_of(record: bytes, what: str) -> dict[str, Any]:
    """Return the fields of a stored record that holds an item; ``what`` names it in errors."""
    fields = decode_event(record)
    if not isinstance(fields, dict) or "content" not in fields:
        raise CorruptStoreError(f"{what} of this session holds no OpenAI Agents item", _OTHER_API)
    return fields
