"""The registry of long-tail operators.

Each operator module in ``tailjit.bench.ops`` defines eager PyTorch functions
and registers them with :func:`operator`.  The registry, which
``tailjit.bench.ops.all_operators`` fills, is the single source the runner,
the reports and the tests read from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

#: Syntax features of the LongTail-Bench analysis, as derived from the source
#: by :mod:`tailjit.bench.tags`.
TAGS = (
    "view",  # view / attribute access: reshape, permute, .shape, basic slicing
    "reduction",  # sum, max, mean, softmax, cumsum, ...
    "branch",  # if/else in Python (ast.If / ast.IfExp)
    "loop",  # for / while / comprehensions
    "adv-index",  # indexing with tensors, gather / scatter / index_select
    "input-dependent",  # data-dependent output shape: nonzero, masks, .item()
    "container",  # Python lists / dicts built at run time
    "broadcast",  # explicit broadcasting: None-indexing, expand, unsqueeze
    "inplace",  # in-place mutation: x[...] = v, add_(), ...
    "third-party",  # numpy or other third-party calls
)

SIZES = ("small", "large")


@dataclass(frozen=True)
class Operator:
    """One long-tail operator of the suite.

    ``fn(*inputs)`` is the eager PyTorch reference.  ``make_inputs(size, gen)``
    returns the positional arguments for ``size`` in :data:`SIZES`, drawn from
    the ``torch.Generator`` ``gen`` so that a seed fixes them.  For a
    differentiable operator, ``grad_argnums`` names the floating-point
    arguments that receive gradients when forward+backward is measured.
    """

    name: str
    domain: str
    fn: Callable
    make_inputs: Callable[[str, torch.Generator], tuple]
    tags: frozenset[str]
    reference: str
    differentiable: bool = False
    grad_argnums: tuple[int, ...] = ()
    jax_fn: Callable | None = None
    module: str = field(default="", compare=False)

    def inputs(self, size: str, seed: int = 0) -> tuple:
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
        gen = torch.Generator().manual_seed(seed)
        return tuple(self.make_inputs(size, gen))

    def training_inputs(self, size: str, seed: int = 0) -> tuple:
        """``inputs(size, seed)`` with the ``grad_argnums`` arguments as fresh leaves that require grad."""
        if not self.differentiable:
            raise ValueError(f"operator {self.name} is not differentiable")
        return tuple(
            a.detach().clone().requires_grad_(True) if i in self.grad_argnums else a
            for i, a in enumerate(self.inputs(size, seed))
        )


_REGISTRY: dict[str, Operator] = {}


def operator(
    *,
    domain: str,
    tags: tuple[str, ...] | list[str],
    reference: str,
    inputs: Callable[[str, torch.Generator], tuple],
    differentiable: bool = False,
    grad_argnums: tuple[int, ...] = (),
    jax: Callable | None = None,
    name: str | None = None,
):
    """Register the decorated eager function as a suite operator."""

    unknown = set(tags) - set(TAGS)
    if unknown:
        raise ValueError(f"unknown tags {sorted(unknown)}; known: {TAGS}")
    if differentiable and not grad_argnums:
        raise ValueError("a differentiable operator must name its grad_argnums")

    def register(fn: Callable) -> Callable:
        op_name = name or fn.__name__
        if op_name in _REGISTRY:
            raise ValueError(f"operator {op_name!r} is registered twice")
        _REGISTRY[op_name] = Operator(
            name=op_name,
            domain=domain,
            fn=fn,
            make_inputs=inputs,
            tags=frozenset(tags),
            reference=reference,
            differentiable=differentiable,
            grad_argnums=tuple(grad_argnums),
            jax_fn=jax,
            module=fn.__module__,
        )
        return fn

    return register


def registered() -> dict[str, Operator]:
    """The operators registered so far, by name (``tailjit.bench.ops.all_operators`` imports them all first)."""
    return dict(sorted(_REGISTRY.items()))
