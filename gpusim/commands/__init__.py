"""Subcommands beyond predict/profiles, one module each with register(subparsers)."""
from __future__ import annotations

import importlib

# Each module defines register(subparsers), adding its parser and a func.
MODULES: list[str] = ["sweep", "compare", "memory", "roofline", "trace", "demo"]


def register(subparsers) -> None:
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
