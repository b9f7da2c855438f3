"""Completions: how a store hands back a write, finished or finishing.

A store that writes inline hands back a finished ``Completion``; a store that
commits in a background thread (group commit) hands back one wrapping a
``Pending`` the thread finishes. Sync callers call ``result()``, async callers
``await`` it; a finished completion never suspends the event loop.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import threading
from collections.abc import Generator, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["Completion", "Pending", "finish_all"]

T = TypeVar("T")

# Guards the hand-over between a finishing thread and a waiter; held for a
# few attribute reads and writes only.
_handover = threading.Lock()


class Pending(Generic[T]):
    """A write another thread finishes, waited on by one thread or one task.

    Lighter than a ``concurrent.futures.Future``: a waiting thread blocks on
    a bare lock, and ``finish_all`` wakes each event loop once per batch of
    writes rather than once per write.
    """

    __slots__ = ("_done", "_loop_waiter", "_ok", "_thread_waiter", "_value")

    def __init__(self) -> None:
        self._done = False
        self._ok = False
        self._value: Any = None
        self._thread_waiter: Any = None
        self._loop_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    @property
    def done(self) -> bool:
        """Tell whether the write has finished."""
        return self._done

    def wait(self) -> T:
        """Block the calling thread until the write is done; return or raise its outcome."""
        waiter = None
        with _handover:
            if not self._done:
                waiter = _thread.allocate_lock()
                waiter.acquire()
                self._thread_waiter = waiter
        if waiter is not None:
            waiter.acquire()
        return self._outcome()

    def __await__(self) -> Generator[Any, None, T]:
        # Awaiting again after a cancellation replaces the earlier waiter.
        future = None
        with _handover:
            if not self._done:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._loop_waiter = (loop, future)
        if future is not None:
            yield from future.__await__()
        return self._outcome()

    def _outcome(self) -> T:
        if self._ok:
            return self._value  # type: ignore[no-any-return]
        raise self._value


def finish_all(outcomes: Iterable[tuple[Pending[Any], bool, Any]]) -> None:
    """Finish writes (pending, ok, value or error) and wake whoever waits on them."""
    loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for pending, ok, value in outcomes:
        with _handover:
            pending._ok, pending._value, pending._done = ok, value, True
            thread_waiter, loop_waiter = pending._thread_waiter, pending._loop_waiter
        if thread_waiter is not None:
            thread_waiter.release()
        if loop_waiter is not None:
            loops.setdefault(loop_waiter[0], []).append(loop_waiter[1])
    for loop, futures in loops.items():
        # A closed loop has no one left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_wake, futures)


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class Completion(Generic[T]):
    """The outcome of a store write: finished now, or when a ``Pending`` finishes."""

    __slots__ = ("_error", "_pending", "_value")

    def __init__(
        self,
        value: T | None = None,
        error: BaseException | None = None,
        pending: Pending[T] | None = None,
    ) -> None:
        self._value = value
        self._error = error
        self._pending = pending

    @classmethod
    def done(cls, value: T) -> Completion[T]:
        """Return a finished completion holding ``value``."""
        return cls(value)

    @classmethod
    def failed(cls, error: BaseException) -> Completion[T]:
        """Return a finished completion that raises ``error``."""
        return cls(error=error)

    @classmethod
    def waiting(cls, pending: Pending[T]) -> Completion[T]:
        """Return a completion that finishes when ``pending`` does."""
        return cls(pending=pending)

    def result(self) -> T:
        """Block until the write is done; return its value or raise its error."""
        if self._pending is not None:
            return self._pending.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def __await__(self) -> Generator[Any, None, T]:
        if self._pending is not None:
            return (yield from self._pending.__await__())
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
