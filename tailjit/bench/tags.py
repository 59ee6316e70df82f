"""Syntax-feature tags derived from an operator's source.

The suite classifies every operator by the Python/PyTorch features its eager
code uses (the LongTail-Bench analysis).  Declared tags are checked against
:func:`derive_tags`, so the classification is a property of the code and not of
the author's opinion.  The analysis covers the function itself (without its
decorators, docstring and annotations) plus every function of the same module
that it calls by plain name, transitively.

Readings of the rules where they leave room: a ``for`` or comprehension over
``range(...)`` or ``reversed(range(...))`` binds a range-loop variable; an
index element that is ``~``/``&``/``|`` of comparisons or mask names counts as
a boolean mask just like a mask name; argument defaults are analysed (they run).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping

from tailjit.bench.registry import TAGS, Operator

VIEW_CALLS = frozenset(
    {
        "view",
        "reshape",
        "permute",
        "transpose",
        "t",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "expand",
        "expand_as",
        "contiguous",
        "narrow",
        "chunk",
        "split",
        "unbind",
        "flip",
        "movedim",
        "size",
        "dim",
        "numel",
    }
)
VIEW_ATTRS = frozenset({"shape", "T", "ndim"})
REDUCTION_CALLS = frozenset(
    {
        "sum",
        "mean",
        "prod",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "any",
        "all",
        "norm",
        "logsumexp",
        "softmax",
        "log_softmax",
        "cumsum",
        "cumprod",
        "cummax",
        "std",
        "var",
        "topk",
        "sort",
        "argsort",
        "median",
        "kthvalue",
    }
)
ADV_INDEX_CALLS = frozenset(
    {
        "gather",
        "index_select",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_put",
        "index_add",
        "index_fill",
        "index_copy",
        "take",
        "take_along_dim",
        "masked_select",
        "embedding",
    }
)
INPUT_DEPENDENT_CALLS = frozenset(
    {"nonzero", "unique", "unique_consecutive", "masked_select", "item", "tolist", "argwhere"}
)
CONTAINER_METHODS = frozenset({"append", "extend", "insert", "pop"})
BROADCAST_CALLS = frozenset(
    {
        "expand",
        "expand_as",
        "broadcast_to",
        "broadcast_tensors",
        "unsqueeze",
        "repeat",
        "repeat_interleave",
        "meshgrid",
        "outer",
    }
)
THIRD_PARTY_ROOTS = frozenset({"np", "numpy", "scipy", "cv2", "sklearn"})

_LOOP_NODES = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_CONTAINER_NODES = (ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp)
#: Fields that hold type annotations: they are not executed code, so they are skipped.
_ANNOTATION_FIELDS = {"annotation", "returns", "type_comment"}


def _function_node(fn: Callable) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda:
    """The parsed definition of ``fn`` with its decorators and docstring removed.

    A lambda is analysed as the first lambda expression of the statement that defines it.
    """
    source = textwrap.dedent(inspect.getsource(fn))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    node = tree.body[0] if tree is not None and tree.body else None
    if fn.__name__ == "<lambda>" and node is not None:
        node = next((n for n in ast.walk(node) if isinstance(n, ast.Lambda)), None)
    if isinstance(node, ast.Lambda):
        return node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"the source of {fn!r} could not be parsed as a def statement or a lambda")
    node.decorator_list = []
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return node


def _walk(node: ast.AST):
    """Like :func:`ast.walk`, but without descending into annotations."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for name, value in ast.iter_fields(current):
            if name in _ANNOTATION_FIELDS:
                continue
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.AST))


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _is_range_iter(node: ast.AST) -> bool:
    """``range(...)``, or ``reversed(range(...))``: the loop variable is a Python int."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return False
    if node.func.id == "range":
        return True
    return node.func.id == "reversed" and len(node.args) == 1 and _is_range_iter(node.args[0])


def _range_loop_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in _walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            if isinstance(node.target, ast.Name) and _is_range_iter(node.iter):
                names.add(node.target.id)
    return names


def _is_mask_expr(node: ast.AST, mask_names: set[str]) -> bool:
    """A comparison, a boolean-mask name, or ``~``/``&``/``|`` of those."""
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.Name):
        return node.id in mask_names
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return _is_mask_expr(node.operand, mask_names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        return _is_mask_expr(node.left, mask_names) or _is_mask_expr(node.right, mask_names)
    return False


def _mask_names(tree: ast.AST) -> set[str]:
    """Names assigned a boolean mask somewhere in the function (to a fixpoint)."""
    assigns = []
    for node in _walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            assigns.append((targets, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name):
            if node.value is not None:
                assigns.append(([node.target.id], node.value))
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for targets, value in assigns:
            new = set(targets) - names
            if new and _is_mask_expr(value, names):
                names |= new
                changed = True
    return names


def _is_basic_index(node: ast.AST, range_names: set[str]) -> bool:
    """Constants, slices, ``...``, ``None``, range-loop variables and +,-,* arithmetic of those."""
    if isinstance(node, (ast.Constant, ast.Slice)):
        return True
    if isinstance(node, ast.Name):
        return node.id in range_names
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_basic_index(node.operand, range_names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        return _is_basic_index(node.left, range_names) and _is_basic_index(node.right, range_names)
    return False


def _index_elements(sub: ast.Subscript) -> list[ast.AST]:
    index = sub.slice
    if isinstance(index, ast.Tuple):
        return list(index.elts)
    return [index]


def _has_subscript_target(target: ast.AST) -> bool:
    if isinstance(target, ast.Subscript):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_has_subscript_target(t) for t in target.elts)
    if isinstance(target, ast.Starred):
        return _has_subscript_target(target.value)
    return False


def _is_list_display(node: ast.AST) -> bool:
    """A list built at run time (not a ``[a, b] = ...`` unpacking target)."""
    return isinstance(node, ast.List) and isinstance(node.ctx, ast.Load)


def _attribute_root(node: ast.Attribute) -> ast.AST:
    value = node.value
    while isinstance(value, ast.Attribute):
        value = value.value
    return value


def _tags_of_tree(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The tags of one function's syntax tree and the plain names it calls."""
    tags: set[str] = set()
    called: set[str] = set()
    range_names = _range_loop_names(tree)
    mask_names = _mask_names(tree)
    for node in _walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if isinstance(node.func, ast.Name):
                called.add(node.func.id)
            if name in VIEW_CALLS:
                tags.add("view")
            if isinstance(node.func, ast.Attribute) and name in REDUCTION_CALLS:
                tags.add("reduction")
            if name is not None and (name in ADV_INDEX_CALLS or name.endswith("_") and name[:-1] in ADV_INDEX_CALLS):
                tags.add("adv-index")
            if name in INPUT_DEPENDENT_CALLS:
                tags.add("input-dependent")
            if name == "where" and len(node.args) + len(node.keywords) == 1:
                tags.add("input-dependent")
            if isinstance(node.func, ast.Attribute):
                if name in CONTAINER_METHODS:
                    tags.add("container")
                if name.endswith("_") and not name.endswith("__"):
                    tags.add("inplace")
            if name in BROADCAST_CALLS:
                tags.add("broadcast")
        elif isinstance(node, ast.Attribute):
            if node.attr in VIEW_ATTRS:
                tags.add("view")
            root = _attribute_root(node)
            if isinstance(root, ast.Name) and root.id in THIRD_PARTY_ROOTS:
                tags.add("third-party")
        elif isinstance(node, ast.Subscript):
            elements = _index_elements(node)
            if all(_is_basic_index(e, range_names) for e in elements):
                tags.add("view")
            else:
                tags.add("adv-index")
            if any(isinstance(e, ast.Constant) and e.value is None for e in elements):
                tags.add("broadcast")
            if any(_is_mask_expr(e, mask_names) for e in elements):
                tags.add("input-dependent")
        elif isinstance(node, (ast.If, ast.IfExp)):
            tags.add("branch")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_has_subscript_target(t) for t in targets):
                tags.add("inplace")
        if isinstance(node, _LOOP_NODES):
            tags.add("loop")
        if isinstance(node, _CONTAINER_NODES) or (isinstance(node, ast.List) and isinstance(node.ctx, ast.Load)):
            tags.add("container")
    return tags, called


def derive_tags(fn: Callable) -> frozenset[str]:
    """The syntax-feature tags of ``fn`` and of the same-module functions it calls by plain name."""
    fn = inspect.unwrap(fn)
    module = fn.__module__
    tags: set[str] = set()
    visited: set[Callable] = set()
    pending = [fn]
    while pending:
        current = pending.pop()
        if current in visited:
            continue
        visited.add(current)
        found, called = _tags_of_tree(_function_node(current))
        tags |= found
        namespace = current.__globals__
        for name in called:
            target = namespace.get(name)
            if inspect.isfunction(target) and target.__module__ == module and target not in visited:
                pending.append(target)
    return frozenset(tags)


def tag_table(operators: Mapping[str, Operator] | Iterable[Operator]) -> dict[str, list[str]]:
    """For every tag of :data:`TAGS`, the sorted names of the operators that declare it."""
    ops = operators.values() if isinstance(operators, Mapping) else operators
    table: dict[str, list[str]] = {tag: [] for tag in TAGS}
    for op in ops:
        for tag in op.tags:
            table[tag].append(op.name)
    return {tag: sorted(names) for tag, names in table.items()}
