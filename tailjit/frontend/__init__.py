"""tailjit's PyTorch frontend: ``torch.compile(fn, backend="tailjit")`` and ``tailjit.jit``.

Importing this module registers the ``tailjit`` Dynamo backend (the package's
``torch_dynamo_backends`` entry point does the same without an import).  See
``docs/frontend.md``."""

from __future__ import annotations

import torch
import torch._dynamo

from tailjit.frontend.backend import tailjit_backend
from tailjit.frontend.explain import explain, explain_graph
from tailjit.frontend.jit import jit
from tailjit.frontend.plan.report import REPORTS, GraphReport

__all__ = ["tailjit_backend", "jit", "explain", "explain_graph", "GraphReport", "REPORTS"]

if "tailjit" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(name="tailjit")(tailjit_backend)
