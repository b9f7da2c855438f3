"""Operator tools on a whole store: ``dump`` (export and import), ``ops``
(stats, check, backup, compact, listing pages) and ``outfile`` (output files
created safely).

Imports nothing itself: ``outfile`` is used by the LMDB store, which ``ops``
imports in turn.
"""
