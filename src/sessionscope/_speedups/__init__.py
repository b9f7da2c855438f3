"""The compiled scope core (``_core``), its pure-Python twin (``_core_py``) and
the stand-ins the hot path takes when Cython is not installed (``_no_cython``).

Nothing imports these directly but ``sessionscope.core``, which picks the build.
"""
