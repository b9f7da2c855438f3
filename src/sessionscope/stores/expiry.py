"""The background thread that expires idle sessions of a store with ``session_ttl``."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import Store

__all__ = ["Expirer"]

_log = logging.getLogger(__name__)


class Expirer:
    """A background thread that expires idle sessions of a store with ``session_ttl``.

    It runs once at start, then every ``min(60, max(1, ttl / 2))`` seconds (at
    most once a second) until ``stop``; an error of one pass is logged and
    the next pass runs all the same.
    """

    def __init__(self, store: Store, ttl: float) -> None:
        self.ttl = ttl
        self.interval = min(60.0, max(1.0, ttl / 2))
        self.passes = 0
        self._store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sessionscope-expirer", daemon=True)

    @property
    def stopping(self) -> bool:
        """Tell whether the store is closing: a pass stops between batches."""
        return self._stop.is_set()

    def start(self) -> None:
        """Start the thread; its first pass runs at once."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (a pass in progress ends after its batch)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                expired = self._store.expire_sessions(None, time.time() - self.ttl).result()
            except Exception:  # nobody else would hear of it; the next pass retries
                _log.exception("expiring idle sessions of %r failed", self._store)
            else:
                _log.debug("expired %d idle sessions of %r", expired, self._store)
            self.passes += 1
            self._stop.wait(self.interval)
