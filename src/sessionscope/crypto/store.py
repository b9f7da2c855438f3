"""EncryptedStore: any store (memory, LMDB, Redis) with its values sealed under data keys.

It implements the Store protocol around another store, which it hands
ciphertext and from which it reads ciphertext back; the service above sees
plaintext, the store below never does. What is sealed, and under which key:

| what | data key | associated data (place) |
|---|---|---|
| an event's record | the user's | ``e``, app, user, session, event id, timestamp |
| a session state value | the user's | ``s``, app, user, session, key |
| a user state value | the user's | ``u``, app, user, key |
| an app state value | the app's | ``a``, app, key |

A sealed event is stored as an event record of its own,
``{"id", "timestamp", "sealed"}``, so the stores' rules that read an event's
id and time (retention, copies, checks) work unchanged. A retried append is
sealed again under another nonce: the rules of a repeat ask the request's
``same_event``, which opens both records and compares them. A sealed
state value is stored as a msgpack ``bin``. Ids, state keys, times, counts
and sizes stay plaintext.

The data store holds a marker: the app ``MARKER_APP`` (not listed) whose app
state names the key store. ``open_store`` refuses a store with the marker
when no key is given, and ``open_encrypted`` one holding data without it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from ..codec import decode_event, decode_stored, events_equal, pack
from ..core import compiled_or_twin
from ..errors import (
    CorruptStoreError,
    EncryptionKeyError,
    IncompatibleStoreError,
    KeyErasedError,
    StoreNotFoundError,
)
from ..stores.completion import Completion
from ..stores.protocol import AsyncChainStore, ChainStore, Store
from ..stores.records import (
    ENCRYPTION_MARKER_APP,
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    BatchSlices,
    EventCopy,
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
)
from .envelope import (
    HEADER,
    SEALED_VERSION,
    Cipher,
    event_place,
    place,
    split,
    state_place,
)
from .kek import Kek, kek_from
from .keyring import Keyring, app_prefix, app_scope, read_meta, user_scope
from .keystore import KeyBackend, check_makeable, open_key_store

__all__ = [
    "MARKER_APP",
    "EncryptedStore",
    "Encryption",
    "checked_kek",
    "marker_of",
    "open_encrypted",
    "raw_store",
]

T = TypeVar("T")
U = TypeVar("U")

# The app whose app state marks a store as encrypted (defined with the records).
MARKER_APP = ENCRYPTION_MARKER_APP
MARKER_FORMAT = 1
# The compiled build of the envelope when there is one (its ciphers come from
# the keyring, which takes the same build).
_envelope = compiled_or_twin("sessionscope.crypto.envelope")
# What an encrypted store keeps opened by default (Encryption.keep_opened):
# a third for state values, the rest for events.
KEEP_OPENED = 24 << 20


@dataclass(frozen=True)
class Encryption:
    """How to open a store encrypted: where its data keys live, and the key that wraps them.

    ``keys`` is the key store's URI (``lmdb:///path``, ``redis://host/db?prefix=``,
    ``memory://``); None: beside an LMDB store (its path plus ``.keys``), in
    memory for a memory store, and required for Redis. The key-encryption
    key comes from exactly one of ``key_file`` (a path), ``key_env`` (an
    environment variable's name) or ``key`` (32 bytes, or a callable
    returning them, e.g. from a KMS). ``keep_opened`` bounds what the store
    keeps in memory of the values it sealed or opened (docs/encryption.md,
    Cost). ``repr`` never shows a key.
    """

    keys: str | None = None
    key_file: str | os.PathLike[str] | None = None
    key_env: str | None = None
    key: bytes | Callable[[], bytes | str] | None = field(default=None, repr=False)
    # Bytes of plaintext (and its ciphertext) the store keeps of what it
    # sealed or opened lately, so that reading it back opens nothing; 0 keeps none.
    keep_opened: int = KEEP_OPENED

    def __post_init__(self) -> None:
        keep = self.keep_opened
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep_opened is a number of bytes, 0 or more, not {keep!r}")

    def kek(self) -> Kek:
        """Return the key-encryption key from its source (EncryptionKeyError if missing)."""
        return kek_from(key_file=self.key_file, key_env=self.key_env, key=self.key)


def raw_store(store: Any) -> Any:
    """Return the store below an EncryptedStore (what dumps and backups read), else ``store``."""
    return store.raw if isinstance(store, EncryptedStore) else store


def marker_of(store: Store) -> dict[str, Any]:
    """Return the encryption marker of a plain store's data ({} when it is not encrypted)."""
    return store.read_app_state(MARKER_APP)


def _key_store_at(encryption: Encryption, default_keys: str | None) -> str:
    location = encryption.keys or default_keys
    if location is None:
        raise ValueError("an encrypted Redis store needs its key store: keys=URI")
    return location


def checked_kek(encryption: Encryption, default_keys: str | None, create: bool = True) -> Kek:
    """Return the KEK, checked against the key store if there is one: before the data is opened.

    A missing or malformed key, or a key that is not the one an existing
    key store's data keys are wrapped under, is refused before the data
    store is opened, so that a new store's path is not created for nothing.
    A key store that does not exist yet is not created here; with
    ``create``, one that could not be made is refused here too.
    """
    kek = encryption.kek()
    location = _key_store_at(encryption, default_keys)
    try:
        keys = open_key_store(location, create=False)
    except StoreNotFoundError:
        if create:
            check_makeable(location)
        return kek
    try:
        meta = read_meta(keys)
    finally:
        keys.close()
    if meta is not None:
        _check_kek(kek, meta, keys)
    return kek


def _check_kek(kek: Kek, meta: dict[str, Any], keys: KeyBackend) -> None:
    if kek.key_id not in (meta.get("kek"), meta.get("next")):
        raise EncryptionKeyError(
            f"the key-encryption key from {kek.source} (key id {kek.key_id}) is not the one "
            f"of the key store {keys.where} (key id {meta.get('kek')})",
            hint="give the key this store was written with",
        )


def open_encrypted(
    inner: Store,
    encryption: Encryption,
    default_keys: str | None,
    create: bool = True,
    kek: Kek | None = None,
) -> EncryptedStore:
    """Return ``inner`` encrypted; check the key and the marker before anything is written.

    A wrong or missing KEK, a key store other than the one the data names,
    and data written without encryption are refused (``inner`` is left as it
    was, and is not closed: the caller closes it); so is a store without
    data that another process may have open (``Store.opened_elsewhere``):
    it would write plaintext into a store marked encrypted. ``kek``, if given, is
    the key ``checked_kek`` returned (a key from a callable is asked once).
    """
    if kek is None:
        kek = encryption.kek()
    location = _key_store_at(encryption, default_keys)
    marker = marker_of(inner)
    if not marker and inner.list_apps():
        raise IncompatibleStoreError(
            "this store holds data written without encryption: it cannot be opened encrypted",
            hint="open it without a key, or export it and import the dump into a new "
            "encrypted store",
        )
    if not marker and inner.opened_elsewhere():
        # Opened there without a key, it would go on writing plaintext into a
        # store marked encrypted, and read sealed values as if they were data.
        raise IncompatibleStoreError(
            "this store holds no data yet, but was opened without encryption elsewhere "
            "(another process, or a Redis client): it cannot be made encrypted now",
            hint="open it without a key; or close it everywhere (for Redis: delete its keys) "
            "and open it with the key first",
        )
    keys = open_key_store(location, create=create and not marker)
    try:
        keyring = _keyring(inner, marker, keys, kek)
    except BaseException:
        keys.close()
        raise
    return EncryptedStore(inner, keyring, encryption.keep_opened)


def _keyring(inner: Store, marker: dict[str, Any], keys: KeyBackend, kek: Kek) -> Keyring:
    meta = read_meta(keys)
    if marker and (meta is None or meta["id"] != marker.get("keystore")):
        raise EncryptionKeyError(
            f"the key store {keys.where} does not hold this store's data keys",
            hint="give the key store (keys=) this store was written with",
        )
    if meta is not None:
        _check_kek(kek, meta, keys)
    if meta is None:
        import secrets

        keys.add(b"meta", pack({"format": 1, "id": secrets.token_hex(16), "kek": kek.key_id}))
        meta = read_meta(keys)
        assert meta is not None
    if not marker:
        inner.write_app_state(
            MARKER_APP, [("keystore", pack(meta["id"])), ("format", pack(MARKER_FORMAT))]
        ).result()
    return Keyring(kek, keys, meta["id"])


# A session's places: of its app, user and session maps, of its events (the
# head), and the key-store keys of its user's and its app's data keys.
_Places = tuple[bytes, bytes, bytes, bytes, bytes, bytes]


def _name(app: str, user: str, session: str) -> str:
    return f"{app!r}/{user!r}/{session!r}"[:300]


def _event_name(fields: Any, app: str, user: str, session: str) -> str:
    event_id = fields.get("id") if isinstance(fields, dict) else None
    return f"event {str(event_id)[:100]!r} of session {_name(app, user, session)}"


class _Then(Completion[U], Generic[T, U]):
    """A store's completion whose value is passed through a function (to open what it holds).

    The function runs once: awaiting again after a cancellation (or calling
    ``result`` again) returns what it gave the first time.
    """

    __slots__ = ("_inner", "_opened", "_then")

    def __init__(self, inner: Awaitable[T], then: Callable[[T], U]) -> None:
        super().__init__()
        self._inner = inner
        self._then = then
        self._opened: tuple[U] | None = None

    def _open_once(self, value: T) -> U:
        if self._opened is None:
            self._opened = (self._then(value),)
        return self._opened[0]

    def result(self) -> U:
        inner: Any = self._inner
        return self._open_once(inner.result())

    def __await__(self) -> Generator[Any, None, U]:
        value = yield from self._inner.__await__()
        return self._open_once(value)


class _SealedSlices:
    """A batch's slices (``BatchSlices``), each sealed when the store below asks for it.

    Asked again (a transaction run again), a slice is packed and sealed
    anew: other nonces, the same plaintext. Asked with ``defer_sealing``,
    a slice has its events sealed and its state items left for the store
    below to seal through ``AppendBatch.seal_state``, once it knows which
    value each key is left with: in a batch of the agent mix most state
    keys are set again by a later event, and a value set again need never
    be sealed.
    """

    __slots__ = ("_seal", "_slices")

    def __init__(
        self, slices: BatchSlices, seal: Callable[[AppendBatch, bool], AppendBatch]
    ) -> None:
        self._slices = slices
        self._seal = seal

    def __len__(self) -> int:
        return len(self._slices)

    def slice(self, number: int, defer_sealing: bool = False) -> AppendBatch:
        return self._seal(self._slices.slice(number), defer_sealing)

    def whole(self) -> AppendBatch:
        return self._seal(self._slices.whole(), False)

    def join(self, results: list[BatchResult]) -> BatchResult:
        return self._slices.join(results)


class EncryptedStore:
    """A Store that seals what it hands the store below and opens what it reads back.

    ``raw`` is the store below (what a dump or a backup copies: ciphertext);
    ``keyring`` its data keys. ``repr`` names both, never a key.
    """

    def __init__(self, inner: Store, keyring: Keyring, keep_opened: int = KEEP_OPENED) -> None:
        self._inner = inner
        self._keyring = keyring
        self._aio: _AsyncEncrypted | None = None
        # Each session's places and the key-store keys of its user's and its
        # app's data keys, made once: an append does not hash ids again.
        self._session_places: dict[tuple[str, str, str], _Places] = {}
        # Values sealed or opened lately: an agent reads back what it just
        # wrote or read, and finding it here costs no AES-GCM call. State
        # values apart from events: a read opens every value of three maps
        # (40 or so on the agent mix, the app's and the user's shared by all
        # their sessions), and events, larger and many more, would push them out.
        self._opened_values = _envelope.Opened(keep_opened // 3)
        self._opened_events = _envelope.Opened(keep_opened - keep_opened // 3)

    def __repr__(self) -> str:
        return f"EncryptedStore({self._inner!r}, {self._keyring!r})"

    @property
    def raw(self) -> Store:
        """Return the store below, which holds ciphertext."""
        return self._inner

    @property
    def keyring(self) -> Keyring:
        """Return the data keys of this store."""
        return self._keyring

    def opened_elsewhere(self) -> bool:
        """Tell whether another process may have the store below open."""
        return self._inner.opened_elsewhere()

    @property
    def kept_bytes(self) -> int:
        """Return the bytes kept of what this store sealed or opened (at most ``keep_opened``)."""
        return int(self._opened_values.size + self._opened_events.size)

    @property
    def path(self) -> Any:
        """Return the path of the store below (None for a store without one)."""
        return getattr(self._inner, "path", None)

    @property
    def aio(self) -> _AsyncEncrypted:
        """Return the async face: the store below's, sealing and opening around it."""
        if self._aio is None:
            self._aio = _AsyncEncrypted(self)
        return self._aio

    # -- sealing ---------------------------------------------------------

    def _fresh_user(self, app: str, user: str) -> Cipher:
        """Return a user's current cipher, read from the key store (another process may
        have erased the key): for what makes a session or sets state outside an append."""
        return self._keyring.current(user_scope(app, user), fresh=True)

    def _fresh_app(self, app: str) -> Cipher:
        """Return an app's current cipher, read from the key store (see ``_fresh_user``)."""
        return self._keyring.current(app_scope(app), fresh=True)

    def _forget(self) -> None:
        """Drop what was derived from the data keys: after an erasure nothing of it may serve."""
        self._opened_values.clear()
        self._opened_events.clear()

    def seal_event(
        self,
        cipher: Cipher,
        app: str,
        user: str,
        session: str,
        event_id: str,
        stamp: float,
        record: bytes,
    ) -> bytes:
        """Return an event record as stored: its id and time, and the record sealed."""
        return cipher.seal_event(self._places(app, user, session)[3], event_id, stamp, record)

    def _seal_items(self, cipher: Cipher, items: Items, *where: str) -> Items:
        return cipher.seal_items(items, place(*where), self._opened_values)

    def _places(self, app: str, user: str, session: str) -> _Places:
        """Return the places of a session's app, user and session maps and events' head.

        Made once a session (the events' head is ``event_place``), with the
        key-store keys of its user's and its app's data keys. A session met
        for the first time has its user's and app's keys read again if they
        are cached: another process may have erased them and made new ones
        (a user who came back), and this one must not seal under the old.
        """
        key = (app, user, session)
        known = self._session_places.get(key)
        if known is None:
            known = (
                place("a", app),
                place("u", app, user),
                place("s", app, user, session),
                event_place(app, user, session),
                user_scope(app, user),
                app_scope(app),
            )
            self._keyring.refresh(known[4])
            self._keyring.refresh(known[5])
            if len(self._session_places) >= 65536:
                self._session_places.clear()
            self._session_places[key] = known
        return known

    def _request(self, request: AppendRequest) -> AppendRequest:
        app, user, session = request.app_name, request.user_id, request.session_id
        at_app, at_user, at_session, at_events, scope, scope_of_app = self._places(
            app, user, session
        )
        # The keyring's current key, not one kept here: a read that met a
        # newer key (another process erased and remade this one) updates it.
        keyring = self._keyring
        cipher = keyring.current(scope)
        app_items, user_items, session_items = (
            request.app_items,
            request.user_items,
            request.session_items,
        )
        event_id, stamp = request.event_id, request.timestamp
        # What an agent reads back in its next turns is kept opened.
        opened = self._opened_values
        return AppendRequest(
            app,
            user,
            session,
            event_id,
            stamp,
            cipher.seal_event(at_events, event_id, stamp, request.event, self._opened_events),
            keyring.current(scope_of_app).seal_items(app_items, at_app, opened)
            if app_items
            else app_items,
            cipher.seal_items(user_items, at_user, opened) if user_items else user_items,
            cipher.seal_items(session_items, at_session, opened)
            if session_items
            else session_items,
            request.marker,
            request.caller_update_time,
            request.caller_last_event_id,
            request.locked,
            request.catch_up,
            self._same_event,
        )

    def _same_event(self, request: AppendRequest, stored: bytes) -> bool:
        """Tell whether ``stored`` holds the event ``request`` seals: a retried append.

        The same record sealed again has another nonce, so other bytes; the
        two are opened and compared as the rules of a repeat compare records.
        Not through ``Opened``: a store may ask this from its writer thread.
        """
        app, user, session = request.app_name, request.user_id, request.session_id
        scope = user_scope(app, user)
        return events_equal(
            self._open_event(app, user, session, stored, scope),
            self._open_event(app, user, session, request.event, scope),
        )

    def _batch(self, batch: AppendBatch, defer_sealing: bool = False) -> AppendBatch:
        """Return a batch with its events sealed, and its state items (unless ``defer_sealing``).

        Deferred, the items stay plaintext and the batch carries
        ``_seal_state``, which the store below calls on what it writes.
        """
        keys, owners = batch.keys, batch.owners
        # Per session of the batch: its user's cipher, its app's, and the
        # places of its three maps, made once.
        places = [self._places(app, user, session) for app, user, session in keys]
        current = self._keyring.current
        users = [current(at[4]) for at in places]
        apps = [current(at[5]) for at in places]
        event_ids, timestamps = batch.event_ids, batch.timestamps
        events, app_items, user_items, session_items = _envelope.seal_many(
            users,
            apps,
            places,
            owners,
            event_ids,
            timestamps,
            batch.events,
            (batch.app_items, batch.user_items, batch.session_items),
            (self._opened_events, self._opened_values),
            not defer_sealing,
        )
        return AppendBatch(
            keys,
            owners,
            event_ids,
            timestamps,
            events,
            app_items,
            user_items,
            session_items,
            self._same_event,
            self._seal_state if defer_sealing else None,
        )

    def _seal_state(self, kind: str, key: tuple[str, str, str], items: Items) -> Items:
        """Return the items a batch leaves in one map sealed (``AppendBatch.seal_state``)."""
        at = self._places(*key)
        if kind == "a":
            return self._keyring.current(at[5]).seal_items(items, at[0], self._opened_values)
        return self._keyring.current(at[4]).seal_items(
            items, at[1] if kind == "u" else at[2], self._opened_values
        )

    def _copy(self, copy: SessionCopy) -> SessionCopy:
        app, user, session = copy.app_name, copy.user_id, copy.session_id
        cipher = self._fresh_user(app, user)
        return SessionCopy(
            app,
            user,
            session,
            copy.create_time,
            copy.last_update_time,
            self._seal_items(cipher, copy.session_items, "s", app, user, session),
            [
                EventCopy(
                    event.event_id,
                    event.timestamp,
                    self.seal_event(
                        cipher, app, user, session, event.event_id, event.timestamp, event.record
                    ),
                )
                for event in copy.events
            ],
        )

    # -- opening ---------------------------------------------------------

    def open_event(
        self, app: str, user: str, session: str, data: bytes, scope: bytes | None = None
    ) -> bytes:
        """Return the record an event of a session was appended with."""
        if scope is None:
            scope = user_scope(app, user)
        return self._open_events(app, user, session, [data], scope)[0]

    def _open_events(
        self, app: str, user: str, session: str, records: list[bytes], scope: bytes
    ) -> list[bytes]:
        """Return the records a session's events were appended with, opened.

        ``open_events`` opens them all at once when nothing is out of the
        ordinary; otherwise each is opened on its own by ``_open_event``,
        which says what is wrong (an altered record, an erased key...).
        """
        at = self._places(app, user, session)[3]
        opened: list[bytes] | None = _envelope.open_events(
            self._keyring.heads(scope), at, records, self._opened_events
        )
        if opened is None:
            opened = [self._open_event(app, user, session, data, scope) for data in records]
        return opened

    def _open_event(self, app: str, user: str, session: str, data: bytes, scope: bytes) -> bytes:
        try:
            fields = decode_event(data)
        except CorruptStoreError as error:
            # Its id is inside what does not decode: the session names it.
            raise CorruptStoreError(
                f"an event of session {_name(app, user, session)} is unreadable ({error.__cause__})"
            ) from error
        try:
            sealed = fields["sealed"]
            where = place("e", app, user, session, fields["id"], fields["timestamp"])
            if sealed[0] != SEALED_VERSION or len(sealed) < HEADER:
                raise ValueError("not a sealed value of this version")
        except (KeyError, TypeError, ValueError, IndexError):
            raise CorruptStoreError(
                f"{_event_name(fields, app, user, session)} is not a sealed event, "
                "in an encrypted store"
            ) from None
        key_id = int.from_bytes(sealed[1:5], "big")
        cipher = self._keyring.cached(scope, key_id)
        if cipher is None:
            cipher = self._keyring.cipher(scope, key_id, _event_name(fields, app, user, session))
        plain = cipher.open(sealed, where)
        if plain is None:
            raise CorruptStoreError(
                f"{_event_name(fields, app, user, session)} fails its authentication: "
                "it was altered, or copied from another place"
            )
        return plain

    def _open(self, sealed: bytes, scope: bytes, where: bytes, what: str) -> bytes:
        try:
            _, key_id = split(sealed)
        except ValueError:
            raise CorruptStoreError(f"{what} is not a sealed value") from None
        plain = self._keyring.cipher(scope, key_id, what).open(sealed, where)
        if plain is None:
            raise CorruptStoreError(
                f"{what} fails its authentication: it was altered, or copied from another place"
            )
        return plain

    def _open_map(self, values: dict[str, Any], scope: bytes, *where: str) -> dict[str, Any]:
        return self._open_values(values, scope, place(*where), where)

    def _open_values(
        self, values: dict[str, Any], scope: bytes, prefix: bytes, where: tuple[str, ...]
    ) -> dict[str, Any]:
        """Return a state map opened: ``prefix`` is its place, ``where`` its kind and ids."""
        values_opened: dict[str, Any] | None = _envelope.open_values(
            self._keyring.heads(scope), prefix, values, self._opened_values
        )
        if values_opened is not None:
            return values_opened
        opened = {}
        for key, sealed in values.items():
            what = f"state value {key[:100]!r} of {'/'.join(repr(w) for w in where[1:])[:300]}"
            if not isinstance(sealed, bytes):
                raise CorruptStoreError(f"{what} is not encrypted, in an encrypted store")
            plain = self._open(sealed, scope, state_place(prefix, key), what)
            opened[key] = decode_stored(plain, "a state value")
        return opened

    def open_loaded(self, loaded: LoadedSession | None) -> LoadedSession | None:
        """Return a session read from the store below with its state and events opened."""
        if loaded is None:
            return None
        record = loaded.record
        app, user, session = record.app_name, record.user_id, record.session_id
        places = self._places(app, user, session)
        at_app, at_user, at_session, _, scope, scope_of_app = places
        keyring = self._keyring
        opened = _envelope.open_session(
            keyring.heads(scope),
            keyring.heads(scope_of_app),
            places,
            (loaded.session_state, loaded.app_state, loaded.user_state),
            loaded.events,
            (self._opened_events, self._opened_values),
        )
        if opened is not None:
            return LoadedSession(record, *opened)
        # Something did not open on the quick path: each opener takes it
        # again, then opens value by value and says why one does not open.
        session_state = self._open_values(
            loaded.session_state, scope, at_session, ("s", app, user, session)
        )
        app_state = self._open_values(loaded.app_state, scope_of_app, at_app, ("a", app))
        user_state = self._open_values(loaded.user_state, scope, at_user, ("u", app, user))
        events = self._open_events(app, user, session, loaded.events, scope)
        return LoadedSession(record, session_state, app_state, user_state, events)

    def _open_result(self, request: AppendRequest) -> Callable[[AppendResult], AppendResult]:
        def then(result: AppendResult) -> AppendResult:
            if result.missed_events:
                app, user = request.app_name, request.user_id
                result.missed_events = self._open_events(
                    app, user, request.session_id, result.missed_events, user_scope(app, user)
                )
            if result.stored_state is not None:
                result.stored_state = self.open_loaded(result.stored_state)
            return result

        return then

    def _open_page(self, page: EventPage | None) -> EventPage | None:
        if page is None:
            return None
        record, events = page
        app, user, session = record.app_name, record.user_id, record.session_id
        opened = self._open_events(
            app, user, session, [data for _, data in events], user_scope(app, user)
        )
        return record, [(pos, plain) for (pos, _), plain in zip(events, opened, strict=True)]

    # -- the Store protocol ----------------------------------------------

    def create_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> Completion[LoadedSession]:
        """Store a new session; see ``Store.create_session``."""
        args = self._create_args(
            app_name, user_id, session_id, create_time, app_items, user_items, session_items
        )
        return _Then(self._inner.create_session(*args), self.open_loaded)  # type: ignore[arg-type]

    def _create_args(
        self,
        app: str,
        user: str,
        session: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> tuple[Any, ...]:
        # A new session reads its user's key afresh: another process may have erased it.
        cipher = self._fresh_user(app, user)
        return (
            app,
            user,
            session,
            create_time,
            self._seal_items(self._fresh_app(app), app_items, "a", app) if app_items else [],
            self._seal_items(cipher, user_items, "u", app, user),
            self._seal_items(cipher, session_items, "s", app, user, session),
        )

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session; see ``Store.load_session``."""
        return self.open_loaded(
            self._inner.load_session(
                app_name, user_id, session_id, num_recent_events, after_timestamp
            )
        )

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a page of a session's events; see ``Store.read_events``."""
        return self._open_page(self._inner.read_events(app_name, user_id, session_id, start, limit))

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return session records; see ``Store.list_sessions``."""
        return self._inner.list_sessions(app_name, user_id)

    def list_page(
        self, app_name: str, user_id: str | None, limit: int | None, after: ListPosition | None
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page``."""
        return self._inner.list_page(app_name, user_id, limit, after)

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session; see ``Store.delete_session``."""
        return self._inner.delete_session(app_name, user_id, session_id)

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event, sealed; see ``Store.append``."""
        completion = self._inner.append(self._request(request))
        if not (request.locked or request.catch_up):
            return completion
        return _Then(completion, self._open_result(request))

    def append_chain(self, requests: list[AppendRequest]) -> Completion[list[AppendResult]]:
        """Append a chain of events to one session, sealed; see ``ChainStore.append_chain``.

        The store below must be a ``ChainStore`` (memory, LMDB).
        """
        inner = cast(ChainStore, self._inner)
        return inner.append_chain([self._request(request) for request in requests])

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch, sealed; see ``Store.append_many``."""
        return self._inner.append_many(self._batch(batch))

    def append_slices(self, slices: BatchSlices) -> Completion[BatchResult]:
        """Append a batch, each slice sealed as the store below asks for it.

        See ``Store.append_slices``: a slice's sealed bytes, like its packed
        ones, live only from its sealing to its write.
        """
        return self._inner.append_slices(_SealedSlices(slices, self._batch))

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, opened; see ``Store.read_app_state``."""
        return self._open_map(
            self._inner.read_app_state(app_name), app_scope(app_name), "a", app_name
        )

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return a user map, opened; see ``Store.read_user_state``."""
        return self._open_map(
            self._inner.read_user_state(app_name, user_id),
            user_scope(app_name, user_id),
            "u",
            app_name,
            user_id,
        )

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        return self._inner.flush()

    def close(self) -> None:
        """Close the store below and the key store."""
        try:
            self._inner.close()
        finally:
            self._keyring.keys.close()

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove old events; see ``Store.truncate_events``."""
        return self._inner.truncate_events(app_name, user_id, session_id, before, keep_last)

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Completion[list[bytes]]:
        """Remove a session's newest events and return them, opened; see ``Store.pop_events``."""
        return _Then(
            self._inner.pop_events(
                app_name, user_id, session_id, count, if_last_event_id=if_last_event_id
            ),
            self._open_popped(app_name, user_id, session_id),
        )

    def _open_popped(
        self, app_name: str, user_id: str, session_id: str
    ) -> Callable[[list[bytes]], list[bytes]]:
        def then(records: list[bytes]) -> list[bytes]:
            return self._open_events(
                app_name, user_id, session_id, records, user_scope(app_name, user_id)
            )

        return then

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete idle sessions; see ``Store.expire_sessions``."""
        return self._inner.expire_sessions(app_name, idle_before)

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Destroy a user's data key, then delete the user's sessions and state.

        The key goes first: from then on nothing of the user's, wherever a
        copy lies (a backup, a dump, pages LMDB has not reused), can be read.
        """
        self._keyring.erase(user_scope(app_name, user_id))
        self._forget()
        return self._inner.delete_user(app_name, user_id)

    def delete_app(self, app_name: str) -> Completion[int]:
        """Destroy the data keys of an app and of its users, then delete the app."""
        self._keyring.erase(app_prefix(app_name), prefix=True)
        self._forget()
        return self._inner.delete_app(app_name)

    def list_apps(self) -> list[str]:
        """Return the apps of the store (the marker apart)."""
        return [app for app in self._inner.list_apps() if app != MARKER_APP]

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app."""
        return self._inner.list_users(app_name)

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session, sealed; see ``Store.restore_session``.

        Values and events are sealed under counter nonces, so an equal session
        stored already is recognised by its plaintext, before the store
        below compares ciphertext.
        """
        if self._stored_equal(
            copy,
            self.load_session(copy.app_name, copy.user_id, copy.session_id, None, None),
        ):
            return Completion.done(False)
        return self._inner.restore_session(self._copy(copy))

    @staticmethod
    def _stored_equal(copy: SessionCopy, loaded: LoadedSession | None) -> bool:
        if loaded is None:
            return False
        stored = SessionCopy.of_record(
            loaded.record,
            [(key, pack(value)) for key, value in loaded.session_state.items()],
            [event_copy(event) for event in loaded.events],
        )
        return copies_equal(stored, copy)

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map, sealed."""
        cipher = self._fresh_app(app_name)
        return self._inner.write_app_state(app_name, self._seal_items(cipher, items, "a", app_name))

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map, sealed."""
        cipher = self._fresh_user(app_name, user_id)
        return self._inner.write_user_state(
            app_name, user_id, self._seal_items(cipher, items, "u", app_name, user_id)
        )

    def rotate_data_key(self, app_name: str, user_id: str | None = None) -> int:
        """Give a user (or, without ``user_id``, the app's state) a new data key; return its id.

        New writes are sealed under it; what was sealed before stays readable.
        """
        scope = app_scope(app_name) if user_id is None else user_scope(app_name, user_id)
        rotated = self._keyring.rotate(scope)
        self._forget()
        return rotated

    def erased_over_new_keys(self, app_name: str, user_id: str | None, sealed: bytes) -> bool:
        """Tell whether a sealed state value is under an erased data key of a user who came back.

        The value is of a user's map (of the app's map without ``user_id``).
        True when its data key was erased and the user (or app) has keys
        again: such a value, set in the map it came from, could be read by
        nobody and would make the whole map, so every session of that user,
        unreadable. An import leaves it out. While the user has no keys, an
        erased value is False here: it is imported, and reading it says the
        key was erased. A value that is not sealed is False too: opening it
        says what is wrong with it.
        """
        scope = app_scope(app_name) if user_id is None else user_scope(app_name, user_id)
        try:
            _, key_id = split(sealed)
        except (TypeError, ValueError):
            return False
        keyring = self._keyring
        if keyring.cached(scope, key_id) is not None or keyring.keys.get(scope) is None:
            return False
        try:
            keyring.cipher(scope, key_id, "a sealed value")
        except KeyErasedError:
            return True
        return False


class _AsyncEncrypted:
    """The async face of an EncryptedStore over the async face of the store below."""

    def __init__(self, store: EncryptedStore) -> None:
        self._store = store
        self._aio: Any = store.raw.aio

    def create_session(self, *args: Any) -> Awaitable[LoadedSession]:
        store = self._store
        return _Then(self._aio.create_session(*store._create_args(*args)), store.open_loaded)  # type: ignore[arg-type]

    async def load_session(self, *args: Any) -> LoadedSession | None:
        return self._store.open_loaded(await self._aio.load_session(*args))

    async def read_events(self, *args: Any) -> EventPage | None:
        return self._store._open_page(await self._aio.read_events(*args))

    async def list_sessions(self, *args: Any) -> list[SessionRecord]:
        result: list[SessionRecord] = await self._aio.list_sessions(*args)
        return result

    async def list_page(self, *args: Any) -> tuple[list[SessionRecord], bool]:
        result: tuple[list[SessionRecord], bool] = await self._aio.list_page(*args)
        return result

    def delete_session(self, *args: Any) -> Awaitable[None]:
        result: Awaitable[None] = self._aio.delete_session(*args)
        return result

    def append(self, request: AppendRequest) -> Awaitable[AppendResult]:
        awaitable: Awaitable[AppendResult] = self._aio.append(self._store._request(request))
        if not (request.locked or request.catch_up):
            return awaitable
        return _Then(awaitable, self._store._open_result(request))

    def append_chain(self, requests: list[AppendRequest]) -> Awaitable[list[AppendResult]]:
        aio = cast(AsyncChainStore, self._aio)
        return aio.append_chain([self._store._request(request) for request in requests])

    def append_many(self, batch: AppendBatch) -> Awaitable[BatchResult]:
        result: Awaitable[BatchResult] = self._aio.append_many(self._store._batch(batch))
        return result

    async def read_app_state(self, app_name: str) -> dict[str, Any]:
        values = await self._aio.read_app_state(app_name)
        return self._store._open_map(values, app_scope(app_name), "a", app_name)

    async def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        values = await self._aio.read_user_state(app_name, user_id)
        return self._store._open_map(values, user_scope(app_name, user_id), "u", app_name, user_id)

    def flush(self) -> Awaitable[None]:
        result: Awaitable[None] = self._aio.flush()
        return result

    async def close(self) -> None:
        try:
            await self._aio.close()
        finally:
            self._store.keyring.keys.close()

    async def truncate_events(self, *args: Any) -> int:
        return int(await self._aio.truncate_events(*args))

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Awaitable[list[bytes]]:
        return _Then(
            self._aio.pop_events(
                app_name, user_id, session_id, count, if_last_event_id=if_last_event_id
            ),
            self._store._open_popped(app_name, user_id, session_id),
        )

    async def expire_sessions(self, *args: Any) -> int:
        return int(await self._aio.expire_sessions(*args))

    async def delete_user(self, app_name: str, user_id: str) -> int:
        self._store.keyring.erase(user_scope(app_name, user_id))
        self._store._forget()
        return int(await self._aio.delete_user(app_name, user_id))

    async def delete_app(self, app_name: str) -> int:
        self._store.keyring.erase(app_prefix(app_name), prefix=True)
        self._store._forget()
        return int(await self._aio.delete_app(app_name))

    async def list_apps(self) -> list[str]:
        return [app for app in await self._aio.list_apps() if app != MARKER_APP]

    async def list_users(self, app_name: str) -> list[str]:
        result: list[str] = await self._aio.list_users(app_name)
        return result

    async def restore_session(self, copy: SessionCopy) -> bool:
        store = self._store
        loaded = await self.load_session(copy.app_name, copy.user_id, copy.session_id, None, None)
        if store._stored_equal(copy, loaded):
            return False
        return bool(await self._aio.restore_session(store._copy(copy)))

    async def write_app_state(self, app_name: str, items: Items) -> None:
        store = self._store
        sealed = store._seal_items(store._fresh_app(app_name), items, "a", app_name)
        await self._aio.write_app_state(app_name, sealed)

    async def write_user_state(self, app_name: str, user_id: str, items: Items) -> None:
        store = self._store
        cipher = store._fresh_user(app_name, user_id)
        await self._aio.write_user_state(
            app_name, user_id, store._seal_items(cipher, items, "u", app_name, user_id)
        )
