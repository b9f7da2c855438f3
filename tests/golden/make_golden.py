"""Write the golden store that tests/test_golden.py reads back, in the current format.

Run it only to add a golden store for a new format version; a committed
store is never rewritten, since its point is to be what an earlier version
wrote (format-1 by version 1 of the layout, format-2 by version 2):

    python tests/golden/make_golden.py tests/golden/format-2
"""

from __future__ import annotations

import sys
from pathlib import Path

from sessionscope import Event, EventActions, LmdbStore, SyncSessionService

APP = "golden"
# Every kind of value and id the contract admits, at fixed times and ids.
VALUES = {
    "none": None,
    "flag": True,
    "int": -(2**63),
    "uint": 2**64 - 1,
    "float": 2.5,
    "text": "héllo wörld ✓",
    "bytes": b"\x00\xff",
    "list": [1, "two", [3.0]],
    "map": {"k": {"nested": [None, False]}},
}
ODD_ID = "s/1:\x00 ünïcode " + "x" * 300
LATE_APP = "golden-late"
LATE_TIMES = (1_700_000_010.0, 1_700_000_030.0, 1_700_000_020.0, 1_700_000_040.0)


def write(path: Path) -> None:
    """Write the golden sessions into a new store at ``path``."""
    with SyncSessionService(LmdbStore(path, map_size=1 << 20)) as service:
        first = service.create_session(
            app_name=APP,
            user_id="ada",
            session_id="s1",
            state={"app:plan": "pro", "user:name": "Ada", "temp:gone": 1, **VALUES},
        )
        for n in range(5):
            service.append_event(
                first,
                Event(
                    id=f"e{n}",
                    author="model" if n % 2 else "user",
                    timestamp=1_700_000_000.0 + n,
                    content={"parts": [{"text": f"turn {n}"}], "blob": bytes([n])},
                    actions=EventActions(state_delta={"turn": n, "user:seen": n, "temp:t": n}),
                    custom_metadata={"n": n},
                ),
            )
        odd = service.create_session(app_name=APP, user_id="bob", session_id=ODD_ID)
        service.append_event(
            odd, Event(id="only", author="user", timestamp=1_700_000_100.0, content="hi")
        )
        # Format 2 and later: events out of time order, so the session keeps a time index.
        late = service.create_session(app_name=LATE_APP, user_id="cy", session_id="late")
        for n, stamp in enumerate(LATE_TIMES):
            service.append_event(late, Event(id=f"l{n}", author="user", timestamp=stamp))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
