"""tailjit's PyTorch frontend: ``torch.compile(fn, backend="tailjit")`` and ``tailjit.jit``.

Importing this module registers the ``tailjit`` Dynamo backend (the package's
``torch_dynamo_backends`` entry point does the same without an import).  See
``docs/frontend.md``."""

from __future__ import annotations

from torch._dynamo.backends import registry

from tailjit.frontend.backend import tailjit_backend
from tailjit.frontend.explain import explain, explain_graph
from tailjit.frontend.jit import jit
from tailjit.frontend.plan.report import REPORTS, GraphReport

__all__ = ["tailjit_backend", "jit", "explain", "explain_graph", "GraphReport", "REPORTS"]

# Not through ``list_backends``: it imports every backend torch ships (AOTAutograd, Inductor's caches: a
# second or more).  A name in ``_BACKENDS`` is one whose entry point ``lookup_backend`` is loading or will load.
if "tailjit" not in registry._BACKENDS:
    registry.register_backend(name="tailjit")(tailjit_backend)
