"""Graph helpers over a program's tensors: the tensors outputs depend on, and which of them reduce.

Fusion, gradients and the frontend walk programs with them; they sit in the IR layer so that
``te.autodiff`` uses them without importing a pass."""

from __future__ import annotations

from tailjit.te.expr import Load, Reduce, TEError, Tensor, walk


def reachable(outputs: list[Tensor]) -> list[Tensor]:
    """All tensors the outputs depend on, producers before consumers.  Iterative: a Python loop
    unrolled by tracing chains thousands of tensors, deeper than the interpreter's recursion limit."""
    order: list[Tensor] = []
    state: dict[int, int] = {}  # 1: on the stack, 2: done
    for root in outputs:
        stack = [(root, None)]
        while stack:
            t, producers = stack.pop()
            if producers is None:  # first visit
                s = state.get(id(t))
                if s == 2:
                    continue
                if s == 1:  # a body assigned after the fact (``t.body = ...``) can read its consumers
                    path = [u for u, p in stack if p is not None and state.get(id(u)) == 1]  # the path from a root
                    cycle = [u.name for u in path[next(k for k, u in enumerate(path) if u is t) :]] + [t.name]
                    raise TEError(f"the program has a cycle: {' reads '.join(map(repr, cycle))}; a compute may "
                                  "read itself only as a te.scan's previous element")  # fmt: skip
                state[id(t)] = 1
                # a scan's own previous element is no producer
                loads = (n.tensor for e in t.exprs() for n in walk(e) if isinstance(n, Load))
                found = [u for u in loads if u is not t or not t.is_scan]
                stack.append((t, found))
                stack.extend((p, None) for p in reversed(found) if state.get(id(p)) != 2)
            elif state[id(t)] == 1:
                state[id(t)] = 2
                order.append(t)
    return order


def has_reduction(t: Tensor) -> bool:
    """Whether ``t``'s body reduces (computing it runs a loop over the reduced axes)."""
    return t.body is not None and any(isinstance(n, Reduce) for n in walk(t.body))
