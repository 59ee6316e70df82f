"""The mark of a value cut off from autograd in a traced training graph (:data:`STOP_GRADIENT`, lowered to
``te.stop_gradient``), and the nodes a gradient flows through past such marks."""

from __future__ import annotations

import torch

from tailjit.frontend.lower.values import is_float


@torch.library.custom_op("tailjit::stop_gradient", mutates_args=())
def _stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x``: in a traced training graph, the mark of a value cut off from autograd (by ``detach()``,
    or computed under ``torch.no_grad()``)."""
    return x.clone()


@_stop_gradient.register_fake
def _(x):
    return torch.empty_like(x)


STOP_GRADIENT = torch.ops.tailjit.stop_gradient.default


def carries_gradient(gm: torch.fx.GraphModule, requires_grad: list) -> set:
    """The nodes of a forward graph that a gradient flows through: the inputs that require grad
    (one flag per input) and the float values computed from them."""
    flags = iter(requires_grad)
    out = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            grad = next(flags)
        else:  # (a detach()ed value carries none)
            grad = (
                n.target is not STOP_GRADIENT
                and any(a in out for a in n.all_input_nodes)
                and is_float(n.meta.get("val"))
            )
        if grad:
            out.add(n)
    return out
