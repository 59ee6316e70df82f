"""Every registered operator: seeded inputs, deterministic finite eager outputs, gradients, jax twins.

An operator whose outputs may legitimately hold NaN says so with "NaN" in its docstring.
"""

from __future__ import annotations

import pytest
import torch

from tailjit.bench.ops import all_operators
from tailjit.bench.registry import SIZES, TAGS

OPERATORS = all_operators()
NAMES = sorted(OPERATORS)
JAX_NAMES = sorted(name for name, op in OPERATORS.items() if op.jax_fn is not None)
DIFF_NAMES = sorted(name for name, op in OPERATORS.items() if op.differentiable)
#: The large size takes minutes over the whole suite: it runs with ``-m slow``.
SIZE_PARAMS = [pytest.param(size, marks=pytest.mark.slow) if size == "large" else size for size in SIZES]


def _leaves(obj) -> list:
    """The tensors (and other leaves) of nested tuples / lists, in order."""
    if isinstance(obj, (tuple, list)):
        return [leaf for item in obj for leaf in _leaves(item)]
    return [obj]


def _documents_nan(op) -> bool:
    return "NaN" in (op.fn.__doc__ or "")


def test_suite_size():
    assert len(OPERATORS) >= 110, f"only {len(OPERATORS)} operators are registered"
    assert len(JAX_NAMES) >= 40, f"only {len(JAX_NAMES)} operators have a jax_fn"
    domains = {op.domain for op in OPERATORS.values()}
    assert len(domains) >= 8, f"only {len(domains)} domains: {sorted(domains)}"


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    op = OPERATORS[name]
    assert op.reference.strip(), "every operator names its paper or library"
    assert op.domain.strip()
    assert op.tags and op.tags <= set(TAGS)
    if op.differentiable:
        assert op.grad_argnums


@pytest.mark.parametrize("size", SIZE_PARAMS)
@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_seeded(name, size):
    op = OPERATORS[name]
    first, again, other = op.inputs(size, seed=0), op.inputs(size, seed=0), op.inputs(size, seed=1)
    leaves, again_leaves, other_leaves = _leaves(first), _leaves(again), _leaves(other)
    assert len(leaves) == len(again_leaves)
    for a, b in zip(leaves, again_leaves):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), "the same seed must give the same inputs"
        else:
            assert a == b
    # float data must follow the seed; small constant float tensors (an image shape) may sit beside it
    pairs = [(a, b) for a, b in zip(leaves, other_leaves) if isinstance(a, torch.Tensor)]
    floats = [(a, b) for a, b in pairs if a.is_floating_point()]
    if floats or pairs:
        assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in floats or pairs), (
            "a different seed gives the same inputs"
        )


@pytest.mark.parametrize("size", SIZE_PARAMS)
@pytest.mark.parametrize("name", NAMES)
def test_eager_is_deterministic_and_finite(name, size):
    op = OPERATORS[name]
    with torch.no_grad():
        out = op.fn(*op.inputs(size, seed=0))
        again = op.fn(*op.inputs(size, seed=0))  # fresh inputs: an operator may mutate its arguments
    leaves, again_leaves = _leaves(out), _leaves(again)
    assert leaves, "the operator returns nothing"
    assert len(leaves) == len(again_leaves)
    for i, (a, b) in enumerate(zip(leaves, again_leaves)):
        assert isinstance(a, torch.Tensor), f"output leaf {i} is a {type(a).__name__}, not a tensor"
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"output leaf {i} differs")
        if a.is_floating_point() and not _documents_nan(op):
            assert not torch.isnan(a).any(), f"output leaf {i} has NaN"


@pytest.mark.parametrize("name", DIFF_NAMES)
def test_backward_gives_finite_gradients(name):
    op = OPERATORS[name]
    args = op.training_inputs("small", seed=0)  # the grad_argnums arguments as leaves that require grad
    for i, (arg, plain) in enumerate(zip(args, op.inputs("small", seed=0))):
        if i in op.grad_argnums:
            assert isinstance(arg, torch.Tensor) and arg.is_floating_point(), f"argument {i}"
            assert arg.requires_grad and arg.is_leaf and torch.equal(arg, plain), f"argument {i}"
        else:
            assert not (isinstance(arg, torch.Tensor) and arg.requires_grad), f"argument {i}"
    outs = [o for o in _leaves(op.fn(*args)) if isinstance(o, torch.Tensor) and o.requires_grad]
    assert outs, "no output depends differentiably on the grad_argnums inputs"
    gen = torch.Generator().manual_seed(0)
    # a random weighting, so that outputs whose plain sum is constant (softmax) still get a gradient
    loss = sum((o.float() * torch.rand(o.shape, generator=gen)).sum() for o in outs)
    loss.backward()
    for i in op.grad_argnums:
        grad = args[i].grad
        assert grad is not None, f"argument {i} receives no gradient"
        assert torch.isfinite(grad).all(), f"argument {i} has a non-finite gradient"


def test_training_inputs_need_a_differentiable_operator():
    op = next(op for op in OPERATORS.values() if not op.differentiable)
    with pytest.raises(ValueError, match="not differentiable"):
        op.training_inputs("small")


def _is_static(arg) -> bool:
    """Python scalars and tuples of them are compile-time constants for ``jax.jit``."""
    if isinstance(arg, tuple):
        return all(_is_static(a) for a in arg)
    return arg is None or isinstance(arg, (bool, int, float, str))


@pytest.mark.parametrize("name", JAX_NAMES)
def test_jax_matches_eager(name):
    jax = pytest.importorskip("jax")
    import numpy as np

    op = OPERATORS[name]
    args = op.inputs("small", seed=0)
    with torch.no_grad():
        expected = [t.numpy() for t in _leaves(op.fn(*op.inputs("small", seed=0)))]
    x64 = any(t.dtype == torch.float64 for t in _leaves(args) if isinstance(t, torch.Tensor))

    def to_jax(obj):
        if isinstance(obj, torch.Tensor):
            array = obj.numpy()
            if not x64 and array.dtype == np.int64:
                array = array.astype(np.int32)
            return jax.numpy.asarray(array)
        if isinstance(obj, (tuple, list)):
            return type(obj)(to_jax(o) for o in obj)
        return obj

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", x64)
    try:
        static = tuple(i for i, a in enumerate(args) if _is_static(a))
        out = jax.jit(op.jax_fn, static_argnums=static)(*(to_jax(a) for a in args))
        actual = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]
    finally:
        jax.config.update("jax_enable_x64", previous)
    assert len(actual) == len(expected), "jax and eager return different numbers of outputs"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"output {i}: jax shape {a.shape}, eager {e.shape}"
        np.testing.assert_allclose(
            a.astype(e.dtype), e, rtol=1e-4, atol=1e-5, equal_nan=_documents_nan(op), err_msg=f"output {i}"
        )
