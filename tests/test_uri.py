"""Store URIs are read in one place: the scheme table and parser of ``stores.uri``.

``open_store``, the replay harness, the command line's LMDB-only commands and
the ADK services all read a URI through it, with the same meaning and messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionscope.bench.replay import TargetError, open_target
from sessionscope.stores import LmdbStore, MemoryStore, open_store
from sessionscope.stores.uri import (
    REDIS_SCHEMES,
    SCHEMES,
    lmdb_path,
    parse_store_uri,
    scheme_of,
)


def test_the_scheme_table() -> None:
    assert set(SCHEMES) == {"lmdb", "memory", "redis", "rediss", "redis+cluster"}
    assert REDIS_SCHEMES == ("redis", "rediss", "redis+cluster")
    assert scheme_of("redis+cluster://h:1") == "redis+cluster"


def test_an_lmdb_uri_reads_as_its_path_and_options() -> None:
    spec = parse_store_uri("lmdb:///srv/my%20store?durability=deferred&file_mode=640&verify=no")
    assert (spec.kind, spec.path) == ("lmdb", "/srv/my store")
    assert spec.options == {"durability": "deferred", "file_mode": 0o640, "verify": False}
    assert parse_store_uri("lmdb://relative/dir").path == "relative/dir"
    assert lmdb_path("lmdb://relative/dir") == Path("relative/dir")
    assert lmdb_path("memory://") is None


def test_a_memory_uri_takes_only_session_ttl() -> None:
    assert parse_store_uri("memory://?session_ttl=5").options == {"session_ttl": 5.0}
    with pytest.raises(ValueError, match="memory:// names no path"):
        parse_store_uri("memory://somewhere")


def test_redis_uris_read_as_server_url_or_cluster_nodes() -> None:
    one = parse_store_uri("rediss://u:secret@h:6380/2?prefix=p&ttl=60&ssl_cert_reqs=none")
    assert (one.kind, one.options) == ("redis", {"prefix": "p", "ttl": 60})
    assert one.url == "rediss://u:secret@h:6380/2?ssl_cert_reqs=none"
    assert "secret" not in repr(one)
    cluster = parse_store_uri("redis+cluster://u:p%40ss@a:7000,[::1]:7001?wait=1")
    assert cluster.nodes == [("a", 7000), ("::1", 7001)]
    assert (cluster.username, cluster.password, cluster.options) == ("u", "p@ss", {"wait": 1})


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("ftp://u:secret@h/x", "unknown store scheme"),
        ("lmdb://", "names no path"),
        ("lmdb:///x?colour=red", "unknown lmdb:// option 'colour'"),
        ("lmdb:///x?map_size=big", "map_size='big' is not valid"),
        ("redis://u:secret@h:1?ssl_ca_certs=x", "ssl_ca_certs= needs a rediss:// URI"),
        ("redis+cluster://u:secret@h", "name each cluster node as host:port"),
        ("redis://u:secret@h:1?ttl=soon", "ttl='soon' is not valid"),
    ],
)
def test_a_bad_uri_is_a_value_error_without_its_password(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_store_uri(uri)
    assert "secret" not in str(caught.value)
    # open_store says the same; the replay harness too, where it knows more targets.
    with pytest.raises(ValueError, match=message):
        open_store(uri)
    target_message = "unknown target scheme" if "scheme" in message else message
    with pytest.raises(TargetError, match=target_message) as target:
        open_target(uri)
    assert "secret" not in str(target.value)


def test_open_store_builds_what_the_spec_names(tmp_path: Path) -> None:
    store = open_store(f"lmdb://{tmp_path / 'db'}?durability=deferred")
    assert isinstance(store, LmdbStore)
    store.close()
    memory = open_store("memory://")
    assert isinstance(memory, MemoryStore)
    memory.close()


def test_the_adk_services_refuse_another_scheme_without_its_password() -> None:
    pytest.importorskip("google.adk")
    from sessionscope.adk import LmdbSessionService, RedisSessionService

    with pytest.raises(ValueError, match="takes an lmdb:// URI") as lmdb:
        LmdbSessionService("redis://u:secret@h:1")
    with pytest.raises(ValueError, match="takes a redis://") as redis:
        RedisSessionService("lmdb://u:secret@h/x")
    assert "secret" not in str(lmdb.value) + str(redis.value)
