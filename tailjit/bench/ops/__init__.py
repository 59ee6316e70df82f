"""Long-tail operators, one module per domain group; each registers with tailjit.bench.registry.operator."""

from __future__ import annotations

import importlib
import pkgutil

from tailjit.bench.registry import Operator, registered


def all_operators() -> dict[str, Operator]:
    """Import every module of this package and return the registry by name."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return registered()
