"""The agent mix: the one generator of agent traffic, for the bench, the benchmarks and traces.

``generate(MixSpec())`` yields the records of a trace (see ``trace``) shaped as
google-adk's Runner writes a session, seeded and deterministic: the same spec
gives the same records, byte for byte once written.

The default mix:

- 1,000 sessions across 100 users and 3 apps, 32 of them live at a time;
- session lengths drawn from a log-normal distribution (median 40 events,
  sigma 1) cut to 5..1,000 events: most sessions are short, a few are long;
- turns as a Runner writes them: the user's message (50 to 2,000 characters),
  zero to three tool calls (a model event with a ``function_call`` part whose
  arguments are nested JSON, then the tool's ``function_response`` with a
  nested result), sometimes a streamed ``partial`` chunk (never stored), and
  the model's final answer, whose text is also saved under the agent's
  ``output_key``;
- state deltas on every scope (session, ``user:``, ``app:``) holding strings,
  ints, floats, bools, lists and nested maps, ``temp:`` values, and now and
  then a ``None`` (the ADK way of clearing a key: it is stored as ``None``);
- about one append in twenty from a second writer of the same session (a
  background task sharing the runner's session), marked ``"locked": true``:
  a replay sends it through ``append_event_locked``;
- before each turn, the read a runner makes: ``get_session`` with
  ``num_recent_events`` (10 or 20, now and then the whole session); every
  ``list_every`` turns a listing; at the end a few sessions deleted.

A session's length counts its stored events (a partial chunk is not stored);
the last turn of a session is cut where its length ends, as a run that stops
mid-turn is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from .trace import write_trace

__all__ = ["MixSpec", "generate", "generate_trace", "session_lengths"]

_VOCABULARY = (
    "the a to of and in is that for it with as on be this are by you can or not "
    "your from we at an will have more if which one all use when also has data "
    "order account refund shipping invoice customer agent tool model request "
    "response status price delivery address update error retry policy search "
    "result summary schedule meeting calendar flight hotel booking payment card "
    "weather forecast report query table column value session state memory "
    "context prompt token budget latency cache index document page section note"
)
_WORDS = _VOCABULARY.split()
_TOOLS = ("search_orders", "get_weather", "book_flight", "lookup_invoice", "run_sql", "send_email")
_AGENTS = ("root_agent", "support_agent", "planner", "billing_agent")
_SECOND_WRITERS = ("memory_writer", "notifier")
_BASE_TIME = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so traces are reproducible
# One stored main event in 19 is followed by one of the second writer: 1 append in 20.
_SECOND_WRITER_EVERY = 19


@dataclass(slots=True, frozen=True)
class MixSpec:
    """The shape of a generated mix; the defaults are the agent mix the figures are measured on.

    ``lengths`` bounds the number of stored events per session and
    ``median_length`` centres the log-normal draw (``sigma`` wide, in natural
    log units); ``lengths=(n, n)`` makes every session ``n`` events long.
    """

    sessions: int = 1000
    apps: int = 3
    users: int = 100
    lengths: tuple[int, int] = (5, 1000)
    median_length: int = 40
    sigma: float = 1.0
    concurrent: int = 32
    second_writer: bool = True
    get_every_turn: bool = True
    list_every: int = 50
    delete_fraction: float = 0.02
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the spec as a JSON-ready map."""
        return {
            "mix": "agent",
            "sessions": self.sessions,
            "apps": self.apps,
            "users": self.users,
            "lengths": list(self.lengths),
            "median_length": self.median_length,
            "sigma": self.sigma,
            "concurrent": self.concurrent,
            "second_writer": self.second_writer,
            "get_every_turn": self.get_every_turn,
            "list_every": self.list_every,
            "delete_fraction": self.delete_fraction,
            "seed": self.seed,
        }

    def check(self) -> None:
        """Raise ValueError for a spec that describes no trace."""
        low, high = self.lengths
        if self.sessions < 1 or self.apps < 1 or self.users < 1 or self.concurrent < 1:
            raise ValueError("sessions, apps, users and concurrent must be at least 1")
        if not 1 <= low <= high:
            raise ValueError(f"lengths {low}..{high}: need 1 <= minimum <= maximum")
        if self.median_length < 1 or self.sigma < 0:
            raise ValueError("median_length must be at least 1 and sigma not negative")


def session_lengths(spec: MixSpec) -> list[int]:
    """Return the stored-event count of each session of a mix, in creation order."""
    return [script.length for script in _Generator(spec).scripts()]


class _Text:
    """Word salad of realistic lengths, cut from one fixed corpus (fast, seeded)."""

    def __init__(self, rng: random.Random) -> None:
        words = [rng.choice(_WORDS) for _ in range(40_000)]
        self.corpus = " ".join(words)
        self.rng = rng

    def __call__(self, low: int, high: int) -> str:
        """Return text of ``low`` to ``high`` characters, most often near the low end."""
        length = int(self.rng.triangular(low, high, low + (high - low) / 5))
        start = self.rng.randrange(0, len(self.corpus) - length - 1)
        text = self.corpus[start : start + length - 1].strip()
        return (text[:1].upper() + text[1:] + ".").ljust(low, ".")


class _Session:
    """Generates the calls of one session, one turn at a time."""

    def __init__(self, gen: _Generator, app: str, user: str, sid: str, length: int) -> None:
        self.gen = gen
        self.app = app
        self.user = user
        self.sid = sid
        self.length = length
        self.left = length
        self.turn = 0
        self.created = False
        self.agent = gen.rng.choice(_AGENTS)
        self.output_key = f"{self.agent.split('_')[0]}_answer"

    @property
    def finished(self) -> bool:
        return self.created and self.left <= 0

    def ids(self) -> dict[str, str]:
        return {"app": self.app, "user": self.user, "session": self.sid}

    def step(self) -> list[dict[str, Any]]:
        """Return the next burst of calls: the create, or one turn (cut at the session's end)."""
        gen, rng = self.gen, self.gen.rng
        if not self.created:
            self.created = True
            state: dict[str, Any] = {
                "agent": self.agent,
                "locale": rng.choice(["en-US", "de-DE", "fr-FR", "ja-JP"]),
                f"{USER_PREFIX}tier": rng.choice(["free", "pro", "enterprise"]),
                f"{TEMP_PREFIX}request_started": gen.clock(),
            }
            return [{"op": "create", **self.ids(), "state": state}]
        self.turn += 1
        calls: list[dict[str, Any]] = []
        if gen.spec.get_every_turn:
            # A runner reads the session before each turn, most often a window.
            window = rng.choice([10, 10, 10, 20, 20, None])
            config = None if window is None else {"num_recent_events": window}
            calls.append({"op": "get", **self.ids(), "config": config})
        invocation = f"e-{rng.getrandbits(64):016x}"
        events = [self._user_event(invocation)]
        for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3])):
            events.extend(self._tool_round(invocation))
        if rng.random() < 0.15:
            # A streamed chunk: never stored, but a runner hands it to the service.
            chunk = {"role": "model", "parts": [{"text": gen.text(20, 120)}]}
            events.append(self._event(self.agent, invocation, chunk, None, partial=True))
        events.append(self._final(invocation))
        for record in events:
            if self.left <= 0:
                break
            record["event"]["timestamp"] = gen.clock()
            calls.append(record)
            if record["event"].get("partial"):
                continue
            self.left -= 1
            if (
                self.left > 0
                and gen.spec.second_writer
                and (rng.randrange(_SECOND_WRITER_EVERY) == 0)
            ):
                second = self._second_writer(invocation)
                second["event"]["timestamp"] = gen.clock()
                calls.append(second)
                self.left -= 1
        return calls

    def _event(
        self,
        author: str,
        invocation: str,
        content: dict[str, Any],
        delta: dict[str, Any] | None,
        partial: bool = False,
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": f"{self.gen.rng.getrandbits(128):032x}",
            "timestamp": 0.0,  # set when the event is sent, so the events stay in time order
            "author": author,
            "invocation_id": invocation,
            "content": content,
        }
        if partial:
            event["partial"] = True
        if delta:
            event["actions"] = {"state_delta": delta}
        return {"op": "append", **self.ids(), "event": event}

    def _user_event(self, invocation: str) -> dict[str, Any]:
        rng = self.gen.rng
        content = {"role": "user", "parts": [{"text": self.gen.text(50, 2000)}]}
        delta: dict[str, Any] | None = None
        if rng.random() < 0.6:
            delta = {
                f"{TEMP_PREFIX}user_input_chars": rng.randrange(50, 2000),
                "last_turn": self.turn,
                "awaiting_reply": True,
                f"{USER_PREFIX}last_message_at": self.gen.clock(),
                f"{USER_PREFIX}last_agent": self.agent,
                f"{USER_PREFIX}returning": self.turn > 1,
            }
        return self._event("user", invocation, content, delta)

    def _tool_round(self, invocation: str) -> list[dict[str, Any]]:
        rng = self.gen.rng
        call_id = f"adk-{rng.getrandbits(96):024x}"
        name = rng.choice(_TOOLS)
        args = self._args(name)
        call = {"id": call_id, "name": name, "args": args}
        parts: list[dict[str, Any]] = [{"function_call": call}]
        if rng.random() < 0.4:
            parts.insert(0, {"text": self.gen.text(20, 200)})
        delta: dict[str, Any] = {
            f"{TEMP_PREFIX}pending_tool": name,
            f"tool_calls.{name}": rng.randrange(1, 50),
            f"{APP_PREFIX}tool_usage.{name}": rng.randrange(1, 10_000),
        }
        if rng.random() < 0.3:
            delta["last_tool_args"] = args
        request = self._event(self.agent, invocation, {"role": "model", "parts": parts}, delta)
        reply = {"id": call_id, "name": name, "response": self._result()}
        response_delta: dict[str, Any] | None = None
        if rng.random() < 0.5:
            response_delta = {
                "tool_ok": rng.random() < 0.95,
                f"{APP_PREFIX}latency_ms.{name}": round(rng.uniform(5, 900), 3),
                f"{TEMP_PREFIX}raw_result": {"rows": rng.randrange(0, 8), "cached": False},
                f"{USER_PREFIX}recent_tools": rng.sample(_TOOLS, 3),
            }
        response = self._event(
            self.agent,
            invocation,
            {"role": "user", "parts": [{"function_response": reply}]},
            response_delta,
        )
        return [request, response]

    def _final(self, invocation: str) -> dict[str, Any]:
        gen, rng = self.gen, self.gen.rng
        answer = gen.text(100, 2000)
        delta: dict[str, Any] = {
            self.output_key: answer,
            "turns": self.turn,
            "awaiting_reply": False,
            "confidence": round(rng.random(), 4),
            f"{TEMP_PREFIX}scratch": {"draft": gen.text(10, 80), "step": self.turn},
        }
        if rng.random() < 0.3:
            delta[f"{USER_PREFIX}preferences"] = {
                "language": rng.choice(["en", "de", "fr", "ja"]),
                "units": rng.choice(["metric", "imperial"]),
                "topics": rng.sample(_WORDS, 3),
                "notify": rng.random() < 0.5,
            }
        if rng.random() < 0.2:
            delta[f"{USER_PREFIX}sessions_seen"] = rng.randrange(1, 500)
        if rng.random() < 0.1:
            delta[f"{APP_PREFIX}model_version"] = rng.choice(["gemini-2.5-flash", "gemini-2.5-pro"])
        if rng.random() < 0.1:
            delta[f"{APP_PREFIX}feature_flags"] = {
                "streaming": rng.random() < 0.5,
                "tools": {"sql": rng.random() < 0.5, "email": True},
                "limits": [rng.randrange(1, 100) for _ in range(3)],
            }
        if rng.random() < 0.25:
            delta["cart"] = [
                {
                    "sku": f"SKU-{rng.randrange(10**6):06d}",
                    "qty": rng.randrange(1, 5),
                    "price": round(rng.uniform(1, 500), 2),
                    "gift": rng.random() < 0.1,
                }
                for _ in range(rng.randrange(1, 6))
            ]
        if rng.random() < 0.06:
            # Clearing keys the ADK way: a None value (stored as None).
            delta[rng.choice(["cart", "last_tool_args", "pending_approval"])] = None
            if rng.random() < 0.5:
                delta[f"{USER_PREFIX}draft_order"] = None
        content = {"role": "model", "parts": [{"text": answer}]}
        return self._event(self.agent, invocation, content, delta)

    def _second_writer(self, invocation: str) -> dict[str, Any]:
        rng = self.gen.rng
        author = rng.choice(_SECOND_WRITERS)
        note = {
            "kind": rng.choice(["reminder", "memory", "status"]),
            "text": self.gen.text(20, 160),
        }
        delta = {
            "notes": [note],
            "background_seq": rng.randrange(1, 10_000),
            f"{USER_PREFIX}unread": rng.randrange(0, 20),
            f"{APP_PREFIX}background_load": round(rng.uniform(0, 1), 3),
            f"{APP_PREFIX}maintenance": rng.random() < 0.05,
            f"{APP_PREFIX}queues": [rng.randrange(0, 100) for _ in range(3)],
        }
        content = {"role": "model", "parts": [{"text": note["text"]}]}
        record = self._event(author, f"bg-{invocation}", content, delta)
        record["locked"] = True
        return record

    def _args(self, name: str) -> dict[str, Any]:
        rng = self.gen.rng
        word = rng.choice(_WORDS)
        if name == "search_orders":
            return {
                "customer": {"id": f"c-{rng.randrange(10**6)}",
                             "tier": rng.choice(["pro", "free"])},
                "filters": {"status": rng.sample(["open", "shipped", "closed", "late"], 2),
                            "since": round(_BASE_TIME - rng.uniform(0, 9e6), 3)},
                "limit": rng.randrange(1, 50),
            }  # fmt: skip
        if name == "get_weather":
            return {
                "city": word.title(),
                "unit": rng.choice(["C", "F"]),
                "days": rng.randrange(1, 8),
            }
        if name == "book_flight":
            return {
                "route": {"from": "SFO", "to": rng.choice(["JFK", "LHR", "NRT", "CDG"])},
                "passengers": [{"name": f"P{i}", "age": rng.randrange(1, 90)}
                               for i in range(rng.randrange(1, 4))],
                "flexible": rng.random() < 0.5,
            }  # fmt: skip
        if name == "lookup_invoice":
            return {"invoice_id": f"INV-{rng.randrange(10**7):07d}", "include": ["lines", "tax"]}
        if name == "run_sql":
            return {"query": f"SELECT * FROM orders WHERE note LIKE '%{word}%' LIMIT 20",
                    "params": [], "timeout_s": 5.0}  # fmt: skip
        return {"to": [f"{word}@example.com"], "subject": self.gen.text(10, 60),
                "body": self.gen.text(50, 400)}  # fmt: skip

    def _result(self) -> dict[str, Any]:
        rng = self.gen.rng
        rows = [
            {"id": rng.randrange(10**6), "status": rng.choice(["open", "shipped", "closed"]),
             "total": round(rng.uniform(1, 900), 2), "note": self.gen.text(10, 60),
             "tags": rng.sample(_WORDS, 2), "refund": rng.random() < 0.1}
            for _ in range(rng.randrange(0, 8))
        ]  # fmt: skip
        page = {"next": None if rng.random() < 0.7 else f"p-{rng.getrandbits(32):08x}",
                "total": len(rows) + rng.randrange(0, 40)}  # fmt: skip
        return {"ok": True, "rows": rows, "page": page, "elapsed_ms": round(rng.uniform(5, 900), 1)}


class _Generator:
    def __init__(self, spec: MixSpec) -> None:
        spec.check()
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.text = _Text(self.rng)
        self.time = _BASE_TIME

    def clock(self) -> float:
        # Milliseconds apart, so every event has its own timestamp and floats stay exact.
        self.time += self.rng.randrange(1, 400) / 1000
        return round(self.time, 3)

    def scripts(self) -> list[_Session]:
        spec, rng = self.spec, self.rng
        apps = [f"app-{i}" for i in range(spec.apps)]
        low, high = spec.lengths
        mu = math.log(spec.median_length)
        scripts = []
        for number in range(spec.sessions):
            user = f"user-{rng.randrange(spec.users):04d}"
            app = apps[rng.randrange(len(apps))]
            sid = f"s-{number:06d}-{rng.getrandbits(32):08x}"
            drawn = round(rng.lognormvariate(mu, spec.sigma))
            scripts.append(_Session(self, app, user, sid, min(high, max(low, drawn))))
        return scripts

    def run(self) -> Iterator[dict[str, Any]]:
        spec, rng = self.spec, self.rng
        pending = self.scripts()
        pending.reverse()
        active: list[_Session] = []
        done: list[_Session] = []
        bursts = 0
        while pending or active:
            while pending and len(active) < spec.concurrent:
                active.append(pending.pop())
            script = active[rng.randrange(len(active))]
            yield from script.step()
            bursts += 1
            if script.finished:
                active.remove(script)
                done.append(script)
            if spec.list_every and bursts % spec.list_every == 0:
                owner = script.user if rng.random() < 0.8 else None
                yield {"op": "list", "app": script.app, "user": owner}
        for script in done:
            if rng.random() < spec.delete_fraction:
                yield {"op": "delete", **script.ids()}


def generate(spec: MixSpec | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records of the mix: the same spec gives the same records."""
    return _Generator(spec or MixSpec()).run()


def generate_trace(path: str | Path, spec: MixSpec | None = None) -> int:
    """Write the mix as a trace file at ``path``; return the number of records."""
    spec = spec or MixSpec()
    return write_trace(
        path, generate(spec), {"generator": {"name": "sessionscope", **spec.to_dict()}}
    )
