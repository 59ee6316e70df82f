"""The steps a planned graph runs, in order: kernels, extern calls and constants, their arguments
referring to the graph's runtime values (:class:`Ref`) and sizes (:class:`SymRef`).  The planner makes them;
the host code generators turn them into Python."""

from __future__ import annotations

from dataclasses import dataclass


class Ref:
    """The runtime value of a graph node (a local of the host function)."""

    __slots__ = ("slot",)

    def __init__(self, slot):
        self.slot = slot


class Broadcast(Ref):
    """A kernel's view of a graph node's value with its broadcast dimensions ``dims`` cut to one element."""

    __slots__ = ("dims",)

    def __init__(self, slot, dims):
        super().__init__(slot)
        self.dims = dims


class SymRef:
    """A size computed from the input sizes."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr


@dataclass(eq=False)
class KernelStep:
    spec: tuple  # (outputs, inputs, name) for tailjit.build
    nodes: list  # the region's fx nodes
    sources: list  # Ref or ("size", sympy expr) stand-ins
    grad_mask: tuple  # per kernel input, whether a gradient flows into it (differentiable graphs)
    outputs: list  # slots
    eager: list  # the region's nodes as extern steps, for a call-time size refusal
    after: list  # steps that read the kernel's outputs (numbers out of 0-d results); the eager path sets them
    kernel: object = None
    n_saved: int = 0  # the spec's last outputs: intermediates the gradient kernel reads (Kernel.n_saved)
    cut: tuple = ()  # the positions of the float outputs no gradient flows into (Kernel.mark_cut)


@dataclass
class ExternStep:
    target: object
    args: object  # templates
    kwargs: object
    slot: int


@dataclass
class ConstStep:
    value: object
    slot: int
