"""Run ADK's command line with sessionscope's schemes registered: ``python -m sessionscope.adk``."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    main()
