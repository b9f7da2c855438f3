"""The state view that agents and tools read and write through.

A session's state is one flat mapping whose keys carry their scope as a prefix
(``app:``, ``user:``, ``temp:``, or none for the session itself). `State` layers
the pending changes of the current step (the delta, which becomes an event's
``actions.state_delta``) on top of the session's current merged state;
`ReadonlyState` offers the same reads and rejects every write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NoReturn

from .core import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from .errors import ReadonlyStateError, StateValueError

__all__ = ["ReadonlyState", "State"]

_NO_DELTA: Mapping[str, Any] = MappingProxyType({})


def _check_key(key: object) -> None:
    """Raise StateValueError unless the key is a str."""
    if not isinstance(key, str):
        raise StateValueError(
            f"state key {key!r} is not storable: keys must be str, not {type(key).__name__}"
        )


class ReadonlyState(Mapping[str, Any]):
    """A read-only view of a session's merged state.

    The view wraps the mapping it is given without copying it, so it follows
    later changes to that mapping. Only assignments through the view are
    rejected: a list or dict read from it is the stored object itself.
    """

    __slots__ = ("_delta", "_value")

    APP_PREFIX: ClassVar[str] = APP_PREFIX
    USER_PREFIX: ClassVar[str] = USER_PREFIX
    TEMP_PREFIX: ClassVar[str] = TEMP_PREFIX

    _value: Mapping[str, Any]
    _delta: Mapping[str, Any]

    def __init__(self, value: Mapping[str, Any]) -> None:
        """Wrap the merged state `value`."""
        self._value = value
        # The read side is shared with State, which keeps a delta; an empty
        # one here keeps that code free of a branch.
        self._delta = _NO_DELTA

    # Reads: the delta is looked at first, as it holds the newest values.

    def __getitem__(self, key: str) -> Any:
        """Return the value of `key`; raise KeyError naming it when missing."""
        delta = self._delta
        if key in delta:
            return delta[key]
        try:
            return self._value[key]
        except KeyError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value of `key`, or `default` when it is missing."""
        delta = self._delta
        if key in delta:
            return delta[key]
        return self._value.get(key, default)

    def has(self, key: str) -> bool:
        """Return whether `key` is set."""
        return key in self._delta or key in self._value

    def __contains__(self, key: object) -> bool:
        """Return whether `key` is set."""
        return key in self._delta or key in self._value

    def __iter__(self) -> Iterator[str]:
        """Iterate over the keys of the merged view, stored keys first."""
        value = self._value
        yield from value
        for key in self._delta:
            if key not in value:
                yield key

    def __len__(self) -> int:
        """Return the number of keys in the merged view."""
        value = self._value
        return len(value) + sum(1 for key in self._delta if key not in value)

    def to_dict(self) -> dict[str, Any]:
        """Return a new dict of the merged view: the value overlaid by the delta."""
        merged = dict(self._value)
        merged.update(self._delta)
        return merged

    def all(self) -> dict[str, Any]:
        """Return a new dict of the merged view (same as to_dict)."""
        return self.to_dict()

    @property
    def value(self) -> Mapping[str, Any]:
        """Return a read-only proxy of the wrapped state."""
        return MappingProxyType(self._value)

    def __repr__(self) -> str:
        """Return a representation showing the merged view."""
        return f"{type(self).__name__}({self.to_dict()!r})"

    # Writes: every path raises, so a read-only context cannot change state
    # by going around __setitem__.

    def _reject(self, action: str, key: object) -> NoReturn:
        """Raise the TypeError of a write through a read-only view."""
        raise ReadonlyStateError(f"state is read-only here: cannot {action} {key!r}")

    def set(self, key: str, value: Any) -> Any:
        """Reject the write: this view is read-only."""
        self._reject("set", key)

    def __setitem__(self, key: str, value: Any) -> None:
        """Reject the write: this view is read-only."""
        self._reject("set", key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Reject the write: this view is read-only."""
        self._reject("set", key)

    def update(self, mapping: Mapping[str, Any]) -> None:
        """Reject the write: this view is read-only."""
        self._reject("update keys", list(mapping))

    def delete(self, key: str) -> None:
        """Reject the deletion: this view is read-only."""
        self._reject("delete", key)

    def __delitem__(self, key: str) -> None:
        """Reject the deletion: this view is read-only."""
        self._reject("delete", key)


class State(ReadonlyState):
    """The session's merged state plus the pending delta of the current step.

    Reads see the delta on top of the value. Every write goes to both, so the
    live state and the delta stay in step; the delta is what the service
    records as the event's ``actions.state_delta``. Keys must be str; values
    are checked only when the delta is stored.
    """

    __slots__ = ()

    _value: dict[str, Any]
    _delta: dict[str, Any]

    def __init__(self, value: dict[str, Any], delta: dict[str, Any] | None = None) -> None:
        """Wrap the merged state `value` and the pending `delta` (a new dict if None)."""
        # Both dicts are used in place, not copied: the caller (the session and
        # the event being built) sees every write.
        self._value = value
        self._delta = {} if delta is None else delta

    @property
    def value(self) -> dict[str, Any]:
        """Return the live state dict, with every write of this view applied."""
        return self._value

    @property
    def delta(self) -> dict[str, Any]:
        """Return the live pending delta: the keys written since this view was made."""
        return self._delta

    def has_delta(self) -> bool:
        """Return whether any write is pending."""
        return bool(self._delta)

    def set(self, key: str, value: Any) -> Any:
        """Set `key` to `value` and return its previous value (None if unset)."""
        _check_key(key)
        previous = self.get(key)
        self._value[key] = value
        self._delta[key] = value
        return previous

    def __setitem__(self, key: str, value: Any) -> None:
        """Set `key` to `value`."""
        _check_key(key)
        self._value[key] = value
        self._delta[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Return the value of `key`, setting it to `default` first when missing."""
        _check_key(key)
        if self.has(key):
            return self[key]
        self[key] = default
        return default

    def update(self, mapping: Mapping[str, Any]) -> None:
        """Set every key of `mapping`; nothing is written if any key is not a str."""
        # Check every key before writing, so a bad key leaves no partial update.
        for key in mapping:
            _check_key(key)
        self._value.update(mapping)
        self._delta.update(mapping)

    def delete(self, key: str) -> None:
        """Remove `key` from the live view and the pending delta.

        A store keeps ``None`` as a value, so a deletion has no form in a delta:
        this does not remove a key that is already stored, and the key comes
        back on the next read of the session. Set it to None to clear it.
        Raise KeyError naming the key when it is not set.
        """
        _check_key(key)
        if key not in self._value and key not in self._delta:
            raise KeyError(key)
        self._value.pop(key, None)
        self._delta.pop(key, None)

    def __delitem__(self, key: str) -> None:
        """Remove `key` from the live view and the pending delta (see delete)."""
        self.delete(key)

    def __repr__(self) -> str:
        """Return a representation showing the value and the pending delta."""
        return f"{type(self).__name__}(value={self._value!r}, delta={self._delta!r})"
