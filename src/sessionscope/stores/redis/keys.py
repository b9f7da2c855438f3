"""Key names of a Redis store: the one place the layout is written down (see ``store``).

``{u...}`` and ``{a...}`` are Redis Cluster hash tags: a session, its events
and its user's state share one slot, and an app's own keys another.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

from ...codec import pack


def _remember(known: dict[Any, Any], key: Any, value: Any, most: int) -> None:
    """Keep ``value`` under ``key``, emptying ``known`` first once it holds ``most`` entries."""
    if len(known) >= most:
        known.clear()
    known[key] = value


class _Keys:
    """Build every key name of one prefix: the one place the layout is written down."""

    def __init__(self, prefix: str) -> None:
        self.base = prefix.encode() + b":"
        self.format = self.base + b"format"
        # The store's apps (a set; its own slot on a cluster).
        self.apps = self.base + b"apps"
        # Tags computed before (ids recur), each dict emptied when full.
        self._user_tags: dict[tuple[str, str], bytes] = {}
        self._app_tags: dict[str, bytes] = {}

    def user_tag(self, app_name: str, user_id: str) -> bytes:
        tag = self._user_tags.get((app_name, user_id))
        if tag is None:
            digest = blake2b(pack([app_name, user_id]), digest_size=16).hexdigest()
            tag = self.base + b"{u" + digest.encode() + b"}"
            _remember(self._user_tags, (app_name, user_id), tag, 4096)
        return tag

    def app_tag(self, app_name: str) -> bytes:
        tag = self._app_tags.get(app_name)
        if tag is None:
            digest = blake2b(pack([app_name]), digest_size=16).hexdigest()
            tag = self.base + b"{a" + digest.encode() + b"}"
            _remember(self._app_tags, app_name, tag, 1024)
        return tag

    def session(self, app_name: str, user_id: str, session_id: str) -> list[bytes]:
        """Return record, events, ids, times, state, positions and names keys of a session."""
        tag = self.user_tag(app_name, user_id)
        sid = session_id.encode()
        return [tag + b"r:" + sid, tag + b"e:" + sid, tag + b"i:" + sid, tag + b"t:" + sid,
                tag + b"s:" + sid, tag + b"o:" + sid, tag + b"n:" + sid]  # fmt: skip

    def user(self, app_name: str, user_id: str) -> list[bytes]:
        """Return the user state, session index, pending and number counter keys of a user."""
        tag = self.user_tag(app_name, user_id)
        return [tag + b"u", tag + b"x", tag + b"p", tag + b"c"]

    def guard(self, app_name: str, user_id: str, token: str) -> bytes:
        return self.user_tag(app_name, user_id) + b"g:" + token.encode()

    def app(self, app_name: str) -> list[bytes]:
        """Return the app state, applied tokens and user directory keys of an app."""
        tag = self.app_tag(app_name)
        return [tag + b"a", tag + b"k", tag + b"d"]
