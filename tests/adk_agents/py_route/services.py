"""Register sessionscope's lmdb:// scheme with ADK's service registry."""

import sessionscope.adk  # noqa: F401  (importing registers the scheme)
