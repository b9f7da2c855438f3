"""The ``bench``, ``replay`` and ``trace`` commands' machinery: ``trace`` (the
trace format and generator), ``replay`` (replay a trace against a target),
``speed`` (the speed table) and ``job`` (the whole benchmark run).

Imported only by those commands and the benchmarks.
"""
