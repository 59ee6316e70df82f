"""What the lowerings, the planner and the training route ask of values and ops: the storage a tensor or a
graph node's value lives in, the storages an op writes in place, whether an op mutates, whether a value is
float."""

from __future__ import annotations

import torch


def tensor_storage(v):
    """An identity of the storage ``v`` lives in, or None for a non-tensor or a sparse tensor: tensors with
    the same one alias (:func:`node_storage` gives a graph node's)."""
    return v.untyped_storage()._cdata if isinstance(v, torch.Tensor) and v.layout == torch.strided else None


def node_storage(node):
    """An identity of the storage a graph node's (fake) value lives in, or None for a non-tensor or a
    sparse value: nodes with the same one alias."""
    return tensor_storage(node.meta.get("val") if isinstance(node, torch.fx.Node) else None)


def written_storages(func, args, kwargs) -> set:
    """The storages the op ``func`` writes in place."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return set()
    bound = dict(zip((a.name for a in schema.arguments), args)) | (kwargs or {})
    return {
        tensor_storage(v)
        for a in schema.arguments
        if a.alias_info is not None and a.alias_info.is_write and isinstance(v := bound.get(a.name), torch.Tensor)
    }


def mutates(target) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def is_float(v) -> bool:
    """Whether ``v`` is a float tensor, or a tuple or list holding one (a fake value of a node)."""
    if isinstance(v, (tuple, list)):
        return any(is_float(x) for x in v)
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point
