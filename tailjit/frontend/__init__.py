"""tailjit's PyTorch frontend: ``torch.compile(fn, backend="tailjit")`` for inference.

Importing this module registers the ``tailjit`` Dynamo backend.  See
``docs/frontend.md``."""

from __future__ import annotations

import torch
import torch._dynamo

from tailjit.frontend.backend import REPORTS, GraphReport, tailjit_backend
from tailjit.frontend.explain import explain_graph

__all__ = ["tailjit_backend", "explain_graph", "GraphReport", "REPORTS"]

if "tailjit" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(name="tailjit")(tailjit_backend)
