"""The syntax-feature analysis: each AST rule on small examples, and the suite's declared tags."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tailjit.bench.ops import all_operators
from tailjit.bench.registry import TAGS, Operator
from tailjit.bench.tags import derive_tags, tag_table

# --- example functions (module level, so that inspect.getsource and call-following work) ---


def plain(x, y):
    """A docstring mentioning x[idx], [1, 2] and np.sum must not count."""
    return x * y + 1.0


def view_method(x):
    return x.reshape(-1)


def view_shape(x):
    return x + x.shape[0]


def view_slices(x):
    return x[..., 1:3] * x[0]


def view_range_index(x):
    out = x.new_zeros(())
    for i in range(3):
        out = out + x[2 * i + 1] - x[-i]
    return out


def view_reversed_range_index(x):
    out = x.new_zeros(())
    for i in reversed(range(3)):
        out = out + x[i]
    return out


def reduction_method(x):
    return x.sum(dim=-1)


def reduction_functional(x):
    return F.softmax(x, dim=-1) + torch.logsumexp(x, dim=-1, keepdim=True)


def builtin_max(x, y):
    return x * max(1, y)


def branch_if(x, flag):
    if flag:
        return x
    return -x


def branch_ifexp(x, flag):
    return x if flag else -x


def loop_for(x):
    for _ in range(2):
        x = x * 2
    return x


def loop_while(x):
    while x.abs() > 1:
        x = x / 2
    return x


def loop_genexp(xs):
    return torch.stack(tuple(x * 2 for x in xs))


def adv_index_tensor(x, idx):
    return x[idx]


def adv_index_mixed(x, idx):
    return x[:, idx]


def adv_index_gather(x, idx):
    return x.gather(1, idx)


def adv_index_scatter_inplace(x, idx, src):
    return x.scatter_add_(0, idx, src)


def input_dependent_nonzero(x):
    return x.nonzero()


def input_dependent_item(x):
    return x * x.max().item()


def input_dependent_where1(x):
    return torch.where(x > 0)


def where3(x):
    return torch.where(x > 0, x, 0.0)


def input_dependent_compare_index(x):
    return x[x > 0]


def input_dependent_mask_name(x, y):
    keep = (x > 0) & ~(y < 1)
    return x[keep]


def input_dependent_mask_inverted(x):
    keep = x > 0
    return x[:, ~keep]


def container_list(x):
    return torch.cat([x, x])


def container_dict(x):
    return {"a": x}


def container_append(x, out):
    out.append(x)
    return out


def container_listcomp(xs):
    return torch.stack([x for x in xs])


def unpacking_target(pair):
    [a, b] = pair
    return a + b


def broadcast_none(x):
    return x[:, None] - x[None, :]


def broadcast_unsqueeze(x):
    return x.unsqueeze(0)


def broadcast_meshgrid(x):
    return torch.meshgrid(x, x, indexing="ij")


def inplace_subscript_store(x):
    y = x.clone()
    y[0] = 0
    return y


def inplace_augassign_subscript(x):
    y = x.clone()
    y[0] += 1
    return y


def inplace_method(x):
    return x.clone().clamp_(min=0)


def augassign_name(x):
    x += 1
    return x


def dunder_call(x):
    return x.__add__(1)


def third_party_numpy(x):
    return torch.from_numpy(np.sqrt(x.numpy()))


def annotated(x: torch.Tensor, idx: list[int]) -> tuple[torch.Tensor, dict[str, int]]:
    y: list[int] = idx
    return x, y


def _helper_with_loop(x):
    for _ in range(2):
        x = x + 1
    return _helper_with_nonzero(x)


def _helper_with_nonzero(x):
    return x.nonzero()


def calls_helper(x):
    return _helper_with_loop(x)


def _recursive(x, n):
    if n == 0:
        return x
    return _recursive(x, n - 1)


def calls_recursive(x):
    return _recursive(x, 3)


_square_rows = lambda x: x.pow(2).sum(dim=1)


def calls_lambda(x):
    return _square_rows(x)


def calls_other_module(x):
    return F.relu(x)


def passes_helper(x):
    return torch.vmap(_helper_with_loop)(x)


def _decorate(fn):
    return fn


@_decorate
def decorated(x):
    return x + 1


RULE_CASES = [
    (plain, set()),
    (view_method, {"view"}),
    (view_shape, {"view"}),
    (view_slices, {"view"}),
    (view_range_index, {"view", "loop"}),
    (view_reversed_range_index, {"view", "loop"}),
    (reduction_method, {"reduction"}),
    (reduction_functional, {"reduction"}),
    (builtin_max, set()),
    (branch_if, {"branch"}),
    (branch_ifexp, {"branch"}),
    (loop_for, {"loop"}),
    (loop_while, {"loop"}),
    (loop_genexp, {"loop"}),
    (adv_index_tensor, {"adv-index"}),
    (adv_index_mixed, {"adv-index"}),
    (adv_index_gather, {"adv-index"}),
    (adv_index_scatter_inplace, {"adv-index", "inplace"}),
    (input_dependent_nonzero, {"input-dependent"}),
    (input_dependent_item, {"input-dependent", "reduction"}),
    (input_dependent_where1, {"input-dependent"}),
    (where3, set()),
    (input_dependent_compare_index, {"input-dependent", "adv-index"}),
    (input_dependent_mask_name, {"input-dependent", "adv-index"}),
    (input_dependent_mask_inverted, {"input-dependent", "adv-index"}),
    (container_list, {"container"}),
    (container_dict, {"container"}),
    (container_append, {"container"}),
    (container_listcomp, {"container", "loop"}),
    (unpacking_target, set()),
    (broadcast_none, {"broadcast", "view"}),
    (broadcast_unsqueeze, {"broadcast", "view"}),
    (broadcast_meshgrid, {"broadcast"}),
    (inplace_subscript_store, {"inplace", "view"}),
    (inplace_augassign_subscript, {"inplace", "view"}),
    (inplace_method, {"inplace"}),
    (augassign_name, set()),
    (dunder_call, set()),
    (third_party_numpy, {"third-party"}),
    (annotated, set()),
    (calls_helper, {"loop", "input-dependent"}),
    (calls_recursive, {"branch"}),
    (calls_lambda, {"reduction"}),
    (_square_rows, {"reduction"}),
    (calls_other_module, set()),
    (passes_helper, set()),
    (decorated, set()),
]


@pytest.mark.parametrize(("fn", "expected"), RULE_CASES, ids=[fn.__name__ for fn, _ in RULE_CASES])
def test_rule(fn, expected):
    assert derive_tags(fn) == frozenset(expected)


def test_every_tag_has_positive_and_negative_examples():
    for tag in TAGS:
        assert any(tag in expected for _, expected in RULE_CASES), f"no positive example for {tag}"
        assert any(tag not in expected for _, expected in RULE_CASES), f"no negative example for {tag}"


def test_nested_function_is_part_of_the_source():
    def outer(x):
        def inner(y):
            return y.sum()

        return inner(x)

    assert derive_tags(outer) == {"reduction"}


def test_non_function_source_is_rejected():
    class Callable:
        def __call__(self, x):
            return x

    with pytest.raises(TypeError, match="def statement or a lambda"):
        derive_tags(Callable)


def _fake_op(name, tags):
    return Operator(
        name=name, domain="d", fn=plain, make_inputs=lambda size, gen: (), tags=frozenset(tags), reference="r"
    )


def test_tag_table_lists_every_tag_and_sorted_names():
    ops = [_fake_op("b", {"loop", "view"}), _fake_op("a", {"loop"})]
    table = tag_table(ops)
    assert set(table) == set(TAGS)
    assert table["loop"] == ["a", "b"]
    assert table["view"] == ["b"]
    assert table["branch"] == []
    assert tag_table({op.name: op for op in ops}) == table


OPERATORS = all_operators()


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_declared_tags_match_the_source(name):
    op = OPERATORS[name]
    derived = derive_tags(op.fn)
    missing = sorted(derived - op.tags)
    extra = sorted(op.tags - derived)
    assert op.tags == derived, f"{name}: declare the missing tags {missing}, drop the extra tags {extra}"
