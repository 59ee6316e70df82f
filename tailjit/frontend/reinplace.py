"""Write a functionalised update of an input into the updated part only.

Functionalisation turns ``heatmap[b][y0:y1, x0:x1] = v`` into a new value of the
whole input, ``select_scatter(heatmap, slice_scatter(..., v), ...)``, and a
trailing ``copy_(heatmap, new)``: compiled as it stands, every such update reads
and writes the whole tensor (CenterNet's target drawing, one 13x13 Gaussian into
an 8x80x128x128 heatmap per object, ran 100 times slower than eager).

Where the scatters' bases are the input itself, seen through the same views as
the copy's destination, everything outside the scattered part is copied back
unchanged, so ``copy_(input, scatter(input, v, view))`` is
``copy_(view(input), v)``: the view nodes run as ATen views on the input and the
copy writes the part alone.  ``v`` must not be a view of an input (its elements
could overlap the destination).
"""

from __future__ import annotations

import torch
import torch.fx

from tailjit.frontend.lowering import node_storage

aten = torch.ops.aten

#: scatter -> (the view it writes through, that view's arguments after ``self`` with their defaults)
_VIEWS = {
    aten.select_scatter.default: (aten.select.int, (None, None)),
    aten.slice_scatter.default: (aten.slice.Tensor, (0, None, None, 1)),
}
_VIEWS_DEFAULTS = dict(_VIEWS.values())

#: ``meta`` key marking the view nodes of a narrowed copy's destination, which must run as views
DESTINATION = "tailjit_update_destination"


def narrow_input_updates(gm: torch.fx.GraphModule) -> bool:
    """Rewrite the graph's scatter-then-copy updates of inputs in place; True when one was."""
    g = gm.graph
    storages = {node_storage(p) for p in g.find_nodes(op="placeholder")} - {None}
    changed = False
    for copy in list(g.find_nodes(op="call_function", target=aten.copy_.default)):
        dest, value = copy.args[0], copy.args[1]
        if dest.op != "placeholder" or copy.kwargs:
            continue
        chain: list[tuple] = []  # (view op, its arguments after self) from dest down
        while _is_node(value) and value.target in _VIEWS and not value.kwargs:
            view, defaults = _VIEWS[value.target]
            extra = _padded(value.args[2:], defaults)
            if not _is_view_of(value.args[0], dest, chain):
                break
            chain.append((view, extra))
            value = value.args[1]
        if not chain or not _is_node(value) or node_storage(value) in storages:
            continue
        with g.inserting_before(copy):
            target = dest
            for view, extra in chain:
                node = g.call_function(view, (target, *extra))
                node.meta["val"] = view(target.meta["val"], *(_val(a) for a in extra))  # sizes may be symbolic
                node.meta[DESTINATION] = True
                target = node
            narrowed = g.call_function(aten.copy_.default, (target, value))
            narrowed.meta["val"] = target.meta["val"]
        copy.replace_all_uses_with(dest)  # copy_ returns its destination
        g.erase_node(copy)
        changed = True
    if changed:
        g.eliminate_dead_code()  # the whole-tensor scatters; copy_ is impure and stays
        gm.recompile()
    return changed


def _is_node(a) -> bool:
    return isinstance(a, torch.fx.Node) and a.op == "call_function"


def _val(a):
    return a.meta["val"] if isinstance(a, torch.fx.Node) else a


def _padded(args: tuple, defaults: tuple) -> tuple:
    return tuple(args) + defaults[len(args) :]


def _is_view_of(base, dest: torch.fx.Node, chain: list[tuple]) -> bool:
    """``base`` is ``dest`` seen through the views of ``chain``, node by node."""
    for view, extra in reversed(chain):
        if not _is_node(base) or base.target is not view or base.kwargs:
            return False
        if _padded(base.args[1:], _VIEWS_DEFAULTS[view]) != extra:
            return False
        base = base.args[0]
    return base is dest
