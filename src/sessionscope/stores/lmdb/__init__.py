"""The embedded LMDB store: ``store`` holds ``LmdbStore``, a thin Store protocol over
``layout`` (keys and records), ``opening`` (checks and errors), ``writer``
(environment, group commit, growth), ``retention`` and ``maintenance``;
``_append`` and ``_locks`` are its hot path, compiled as ``_append_c`` and
``_locks_c`` (``sessionscope.core.compiled_or_twin`` picks the build).
"""

from __future__ import annotations

from .store import FORMAT_VERSION, LmdbStore, path_uri

__all__ = ["FORMAT_VERSION", "LmdbStore", "path_uri"]
