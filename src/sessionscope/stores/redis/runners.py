"""Run plans on redis-py clients: ``_SyncRunner`` on a sync one, ``_AsyncRunner`` on an asyncio one.

A runner sends each round trip a plan yields (one command, or a pipeline),
hands the replies back, loads the function library where the server has
none, and maps every Redis failure to the ``StoreError`` a caller sees
(``_failure``). A lost connection is retried once, with a logged backoff.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any, TypeVar

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ...errors import CorruptStoreError, StoreError
from .. import redact
from .common import RECORD_ALTERED, Command, Plan, _library_code

T = TypeVar("T")

_log = logging.getLogger(__name__)
# The connections a client keeps to one server (or one cluster node). A plan
# holds at most one of them at a time (two on a cluster node: a pipeline
# holds one while the client asks the default node for a function call's
# keys), so a runner that lets no more plans run at once than that allows
# never finds a pool empty: the next call waits for a plan to finish, where
# redis-py's pool would fail it ("Too many connections").
POOL_SIZE = 100


def _plans_at_once(cluster: bool) -> int:
    return POOL_SIZE // 2 if cluster else POOL_SIZE


# The code of a function's error about a session record altered by hand
# (see functions.lua), and where in the script the server says it was raised.
_CORRUPT_CODE = "SESSIONSCOPE_CORRUPT "
_SCRIPT_PLACE = re.compile(r"\s*script: \S+, on @user_function:\d+\.?\s*$")

# What a Redis client raises: redis-py's cluster client also raises
# RedisClusterException (no reachable node, cluster mode off), which is no RedisError.
_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def _failure(error: BaseException, where: str) -> StoreError:
    """Return the StoreError a caller sees for a Redis failure."""
    corrupt = _corrupt_record(error)
    if corrupt is not None:
        return corrupt
    if isinstance(error, redis.exceptions.TimeoutError):
        hint = f"{where} did not answer in time: check that it runs and is not overloaded"
    elif isinstance(error, redis.exceptions.ConnectionError):
        hint = f"cannot reach {where}: check that redis-server runs and the URI is right"
    elif _out_of_memory(error):
        # (redis-py's OutOfMemoryError drops the reply's "OOM" prefix.)
        failure = StoreError(
            f"Redis is out of memory: {redact(str(error))}",
            hint="raise the server's maxmemory or free space, then retry (events already "
            "stored answer as repeats); keep maxmemory-policy noeviction, so that nothing "
            "stored is evicted",
        )
        failure.__cause__ = error
        return failure
    elif isinstance(error, redis.exceptions.RedisClusterException):
        hint = (
            f"no cluster at {where}: check that the nodes run with cluster-enabled yes "
            "and that the URI names them (redis:// for a single server)"
        )
    else:
        hint = "the server refused the command; what was stored before is intact"
    failure = StoreError(f"Redis failed: {redact(str(error))}", hint=hint)
    failure.__cause__ = error
    return failure


def _corrupt_record(error: BaseException) -> CorruptStoreError | None:
    """Return the error of a session record a function found altered by hand, else None.

    The function's error (``CORRUPT`` in functions.lua) names the session;
    the server may add where in the script it was raised, which is left out.
    """
    if not isinstance(error, redis.exceptions.ResponseError):
        return None
    text = str(error)
    if not text.startswith(_CORRUPT_CODE):
        return None
    message = _SCRIPT_PLACE.sub("", text[len(_CORRUPT_CODE) :]).strip()
    failure = CorruptStoreError(message, hint=RECORD_ALTERED)
    failure.__cause__ = error
    return failure


def _out_of_memory(error: BaseException) -> bool:
    return isinstance(error, redis.exceptions.OutOfMemoryError) or (
        isinstance(error, redis.exceptions.ResponseError) and str(error).startswith("OOM")
    )


def _missing_library(replies: Iterable[Any]) -> bool:
    return any(_not_found(r) for r in replies)


def _not_found(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.ResponseError) and "Function not found" in str(reply)


class _Tolerant(list[Command]):
    """Commands of a plan that takes their error replies itself (a bulk append's calls).

    The runner hands each error reply back in its place as the StoreError a
    caller sees, and a call the server did not run for want of the function
    library as ``_RELOADED``, after loading the library: the plan sends
    again only what did not run. Other plans get the first error raised,
    and every command sent again after a load (each is idempotent).
    """


# In place of a reply to a call that found no function library (see _Tolerant).
_RELOADED = object()


def _tolerated(replies: list[Any], reloaded: bool, where: str) -> list[Any]:
    """Return the replies of ``_Tolerant`` commands as the plan takes them."""
    return [
        _RELOADED if reloaded and _not_found(reply)
        else _failure(reply, where) if isinstance(reply, redis.exceptions.RedisError)
        else reply
        for reply in replies
    ]  # fmt: skip


class _LoggedBackoff(ExponentialBackoff):
    """redis-py's exponential backoff, logging each retry (it is asked before each one)."""

    def __init__(self, where: str) -> None:
        super().__init__(cap=0.2, base=0.02)
        self.where = where

    def compute(self, failures: int) -> float:
        _log_retry(self.where)
        return super().compute(failures)


def _lost_connection(reply: Any) -> bool:
    """Tell whether a pipeline's reply is the error of a connection lost on its way."""
    return isinstance(reply, redis.exceptions.ConnectionError)


def _log_retry(where: str) -> None:
    _log.info("lost the connection to the Redis server at %s: retrying", where)


def _retry(where: str, asynchronous: bool) -> Retry | AsyncRetry:
    # A lost connection is retried once: every command a plan sends is
    # idempotent (appends by event id, creates by session number). A timeout
    # is not: a server that did not answer in ``timeout`` (stopped, or
    # overloaded) would only make the caller wait a second full timeout.
    # An asyncio client needs redis-py's asyncio Retry: the sync one would
    # hand back the coroutine it was given without awaiting it, so that a
    # connection the server dropped (its idle timeout, a restart) failed
    # the next call instead of being retried.
    kind = AsyncRetry if asynchronous else Retry
    return kind(
        _LoggedBackoff(where),
        retries=1,
        supported_errors=(redis.exceptions.ConnectionError,),
    )


class _SyncRunner:
    """Run plans on a sync client."""

    def __init__(self, client: Any, where: str, cluster: bool) -> None:
        self.client = client
        self.where = where
        self.cluster = cluster
        self._slots = threading.BoundedSemaphore(_plans_at_once(cluster))

    def run(self, plan: Plan[T]) -> T:
        with self._slots:
            try:
                commands = next(plan)
                while True:
                    try:
                        replies = self._execute(commands)
                    except StoreError as error:
                        # Raised where the plan waits: a bulk append keeps what it took.
                        commands = plan.throw(error)
                    else:
                        commands = plan.send(replies)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    def _execute(self, commands: list[Command]) -> list[Any]:
        try:
            replies = self._send(commands)
            reloaded = _missing_library(replies)
            if reloaded:
                self.load_library()
                if type(commands) is not _Tolerant:
                    replies = self._send(commands)
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        if type(commands) is _Tolerant:
            return _tolerated(replies, reloaded, self.where)
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise _failure(reply, self.where) from reply
        return replies

    def _send(self, commands: list[Command]) -> list[Any]:
        if len(commands) == 1:
            try:
                return [self.client.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as error:
                return [error]
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def load_library(self) -> None:
        _log.info("loading sessionscope's functions on %s (new, restarted or flushed)", self.where)
        code = _library_code()
        if self.cluster:
            self.client.execute_command(
                "FUNCTION LOAD", "REPLACE", code, target_nodes=self.client.PRIMARIES
            )
        else:
            self.client.execute_command("FUNCTION LOAD", "REPLACE", code)


class _AsyncRunner:
    """Run plans on an asyncio client."""

    def __init__(self, client: Any, where: str, cluster: bool) -> None:
        self.client = client
        self.where = where
        self.cluster = cluster
        # Made in the runner's own loop (one runner per loop).
        self._slots = asyncio.Semaphore(_plans_at_once(cluster))

    async def run(self, plan: Plan[T]) -> T:
        async with self._slots:
            try:
                commands = next(plan)
                while True:
                    try:
                        replies = await self._execute(commands)
                    except StoreError as error:
                        # Raised where the plan waits: a bulk append keeps what it took.
                        commands = plan.throw(error)
                    else:
                        commands = plan.send(replies)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    async def _execute(self, commands: list[Command]) -> list[Any]:
        try:
            replies = await self._send_again_once(commands)
            reloaded = _missing_library(replies)
            if reloaded:
                await self.load_library()
                if type(commands) is not _Tolerant:
                    replies = await self._send_again_once(commands)
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        except OSError as error:
            raise _failure(redis.exceptions.ConnectionError(str(error)), self.where) from error
        if type(commands) is _Tolerant:
            return _tolerated(replies, reloaded, self.where)
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise _failure(reply, self.where) from reply
        return replies

    async def _send_again_once(self, commands: list[Command]) -> list[Any]:
        try:
            replies = await self._send(commands)
        except redis.exceptions.ConnectionError:
            if not self.cluster:
                raise
            # redis-py's asyncio cluster client asks a node for a function
            # call's keys (COMMAND GETKEYS) before its own retry loop, on a
            # connection the node may have dropped (its idle timeout, a
            # restart): sent again once here, as that loop would have.
            # Every command a plan sends is idempotent.
            _log_retry(self.where)
            return await self._send(commands)
        if self.cluster and any(_lost_connection(reply) for reply in replies):
            # Asked not to raise (so that a missing library comes back as a
            # reply), redis-py's asyncio cluster pipeline answers the commands
            # of a node whose connection closed while their replies were read
            # with that error, where raising it would have retried them.
            _log_retry(self.where)
            return await self._send(commands)
        return replies

    async def _send(self, commands: list[Command]) -> list[Any]:
        if len(commands) == 1:
            try:
                return [await self.client.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as error:
                return [error]
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def load_library(self) -> None:
        _log.info("loading sessionscope's functions on %s (new, restarted or flushed)", self.where)
        code = _library_code()
        if self.cluster:
            await self.client.execute_command(
                "FUNCTION LOAD", "REPLACE", code, target_nodes=self.client.PRIMARIES
            )
        else:
            await self.client.execute_command("FUNCTION LOAD", "REPLACE", code)
