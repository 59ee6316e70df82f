"""Write functionalised partial updates into the updated part only.

Functionalisation turns ``heatmap[b][y0:y1, x0:x1] = v`` into a new value of the
whole tensor, ``select_scatter(heatmap, slice_scatter(..., v), ...)``, and, for an
input, a trailing ``copy_(heatmap, new)``: compiled as it stands, every such
update reads and writes the whole tensor (CenterNet's target drawing, one 13x13
Gaussian into an 8x80x128x128 heatmap per object, ran 100 times slower than
eager; ``out[b, :n] = x[b, :n].flip(0)`` for each sequence of a batch, quadratic
in the batch).

A scatter chain writes ``v`` through views of its base and copies the rest, so it
is ``copy_(view(base), v)`` followed by ``base`` itself, when nothing reads the
base's old elements afterwards.  Two cases qualify:

* an input's update, ``copy_(input, scatter(input, v, view))``: the old value is
  gone once the copy back runs;
* an update of a value the graph computed (a clone, an earlier update) through a
  part bounded by data (``out[b, :n]`` with ``n = lengths[b].item()``), whose old
  elements no node reads after the update (sizes alone may still be read).  A
  part of static bounds stays a scatter: the kernel that computes the base
  writes it in place (``adv[t] = ...`` of GAE's loop, one kernel for all steps),
  where sizes read from data split the graph into a region per update.

The view nodes run as ATen views of the base and the copy writes the part alone.
``v`` must not share memory with the base (its elements could overlap the
destination).
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from tailjit.frontend.lower.symbolic import Unsupported, sym_expr
from tailjit.frontend.lower.values import node_storage

aten = torch.ops.aten

#: scatter -> (the view it writes through, that view's arguments after ``self`` with their defaults)
_VIEWS = {
    aten.select_scatter.default: (aten.select.int, (None, None)),
    aten.slice_scatter.default: (aten.slice.Tensor, (0, None, None, 1)),
}
_VIEWS_DEFAULTS = dict(_VIEWS.values())

#: Views that keep the elements in order: to their input's own sizes, no-ops.
_SAME_SIZE_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default})

#: Ops that read a tensor's sizes, not its elements.
_METADATA = frozenset({aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default})

#: ``meta`` key marking the view nodes of a narrowed copy's destination, which must run as views
DESTINATION = "tailjit_update_destination"


def narrow_updates(gm: torch.fx.GraphModule) -> bool:
    """Rewrite the graph's scatter updates in place (both cases above); True when one was."""
    g = gm.graph
    inputs = {node_storage(p) for p in g.find_nodes(op="placeholder")} - {None}
    changed = _narrow_input_updates(g, inputs)
    changed = _narrow_value_updates(g, inputs) or changed
    if changed:
        g.eliminate_dead_code()  # the whole-tensor scatters; copy_ is impure and stays
        gm.recompile()
    return changed


def _narrow_input_updates(g: torch.fx.Graph, inputs: set) -> bool:
    changed = False
    for copy in list(g.find_nodes(op="call_function", target=aten.copy_.default)):
        dest = copy.args[0]
        if dest.op != "placeholder" or copy.kwargs:
            continue
        chain, value = unwrap(copy.args[1], dest)
        value = _source(value, inputs)
        if not chain or not _is_node(value) or node_storage(value) in inputs:
            continue
        _write_through(g, copy, dest, chain, value)
        copy.replace_all_uses_with(dest)  # copy_ returns its destination
        g.erase_node(copy)
        changed = True
    return changed


def _narrow_value_updates(g: torch.fx.Graph, inputs: set) -> bool:
    order = {n: float(i) for i, n in enumerate(g.nodes)}
    changed = False
    for top in list(g.nodes):
        if top not in order or not _is_scatter(top) or any(_is_scatter(u) and u.args[1] is top for u in top.users):
            continue  # gone, or an inner scatter of a chain (its top rewrites it)
        base = top.args[0]
        storage = node_storage(base)
        if not _is_node(base) or storage is None or storage in inputs or _is_view(base):
            continue
        chain, value = unwrap(top, base)
        if not any(_read_from_data(a) for _, extra in chain for a in extra):
            continue  # one kernel can write the part into the base's buffer (GAE's ``adv[t] = ...``)
        # ``copy(part, src)`` writes src broadcast into the part, as copy_ does; ``part`` is often the destination view
        part = value.args[0] if _is_node(value) and value.target is aten.copy.default else None
        value = _source(value, {storage})
        if not isinstance(value, torch.fx.Node) or node_storage(value) in (None, storage):
            continue
        if _read_after(base, order[top], order):
            continue
        for node in _write_through(g, top, base, chain, value, part):
            order[node] = order[top] - 0.5
        top.replace_all_uses_with(base)
        changed = True
    return changed


def unwrap(value, dest: torch.fx.Node) -> tuple[list[tuple], object]:
    """The views (op, arguments after self) from ``dest`` down through which the scatters of ``value`` write,
    and the value they write."""
    chain: list[tuple] = []
    while _is_scatter(value):
        view, defaults = _VIEWS[value.target]
        extra = padded(value.args[2:], defaults)
        if not _is_view_of(value.args[0], dest, chain):
            break
        chain.append((view, extra))
        value = value.args[1]
    return chain, value


def _source(value, avoid: set):
    """What ``copy_`` needs of a value written into a part: ``copy(part, src)``, ``expand(src, part's sizes)``
    and a view to ``src``'s own sizes write ``src`` broadcast into the part, as copy_ broadcasts it.  Stops at a
    value whose memory is in ``avoid`` (it could overlap the destination; the copy in front of it does not)."""
    while _is_node(value):
        if value.target is aten.copy.default:
            inner = value.args[1]
        elif value.target is aten.expand.default or (
            value.target in _SAME_SIZE_VIEWS and _same_sizes(value, value.args[0])
        ):
            inner = value.args[0]
        else:
            break
        if not isinstance(inner, torch.fx.Node) or node_storage(inner) in avoid | {None}:
            break
        value = inner
    return value


def _read_from_data(a) -> bool:
    """Whether ``a`` is a size or index computed from tensor data (``lengths[b].item()``): a kernel cannot
    take the part it bounds, so each such update is a region of its own, which would rebuild the whole base."""
    return isinstance(a, torch.fx.Node) and bool(free_unbacked_symbols(a.meta.get("val")))


def _same_sizes(a: torch.fx.Node, b) -> bool:
    if not isinstance(b, torch.fx.Node) or not isinstance(b.meta.get("val"), torch.Tensor):
        return False
    sa, sb = a.meta["val"].shape, b.meta["val"].shape
    try:
        return len(sa) == len(sb) and all(sym_expr(x) == sym_expr(y) for x, y in zip(sa, sb))
    except Unsupported:
        return False


def _write_through(
    g: torch.fx.Graph, before: torch.fx.Node, dest: torch.fx.Node, chain: list, value, part=None
) -> list:
    """Insert ``copy_(view(dest), value)`` before ``before``; the new nodes.  The view is ``part`` when that
    node is it already (its fake value with sizes read from data costs about 1 ms to make again)."""
    new = []
    with g.inserting_before(before):
        if part is not None and _is_view_of(part, dest, chain):
            target = part
            for _ in chain:
                part.meta[DESTINATION] = True
                part = part.args[0]
        else:
            target = dest
            for view, extra in chain:
                node = g.call_function(view, (target, *extra))
                node.meta["val"] = view(target.meta["val"], *(_val(a) for a in extra))  # sizes may be symbolic
                node.meta[DESTINATION] = True
                new.append(node)
                target = node
        copy = g.call_function(aten.copy_.default, (target, value))
        copy.meta["val"] = target.meta["val"]
    return [*new, copy]


def _read_after(base: torch.fx.Node, position: float, order: dict) -> bool:
    """Whether a node after ``position`` reads elements of ``base``, directly or through a view."""
    storage = node_storage(base)
    stack, seen = [base], {base}
    while stack:
        for user in stack.pop().users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_function" and user.target in _METADATA:
                continue
            if user.op == "call_function" and node_storage(user) == storage:
                stack.append(user)  # a view: its readers read the base
            elif order.get(user, position + 1) > position:
                return True
    return False


def _is_view(n: torch.fx.Node) -> bool:
    """Whether ``n`` shares the memory of one of its arguments (other aliases of it would see a write)."""
    return any(node_storage(a) == node_storage(n) for a in n.all_input_nodes)


def _is_scatter(n) -> bool:
    return _is_node(n) and n.target in _VIEWS and not n.kwargs


def _is_node(a) -> bool:
    return isinstance(a, torch.fx.Node) and a.op == "call_function"


def _val(a):
    return a.meta["val"] if isinstance(a, torch.fx.Node) else a


def padded(args, defaults: tuple) -> tuple:
    """``args`` with the trailing defaults it leaves out."""
    return tuple(args) + defaults[len(args) :]


def _is_view_of(base, dest: torch.fx.Node, chain: list[tuple]) -> bool:
    """``base`` is ``dest`` seen through the views of ``chain``, node by node."""
    for view, extra in reversed(chain):
        if not _is_node(base) or base.target is not view or base.kwargs:
            return False
        if padded(base.args[1:], _VIEWS_DEFAULTS[view]) != extra:
            return False
        base = base.args[0]
    return base is dest
