"""te.constant: small tensors of known values compiled into the kernel."""

import numpy as np
import pytest
import torch

import tailjit
from tailjit import te


def test_constant_values_dtypes_and_broadcast():
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    stds = te.constant([0.1, 0.1, 0.2, 0.2], name="stds")
    table = te.constant(np.array([[1, -2], [3, 4]], dtype=np.int64), name="table")
    flags = te.constant(torch.tensor([True, False, True, True]), name="flags")
    assert (stds.dtype, table.dtype, flags.dtype) == (te.float32, te.int64, te.bool_)
    y = te.compute(
        (n, 4),
        lambda i, j: te.select(flags[j], x[i, j] / stds[j], te.cast(table[j // 2, j % 2], "float32")),
        name="y",
    )
    k = tailjit.build(y, [x])
    assert k.input_names == ["x"] and "stds" in k.source
    a = torch.randn(6, 4)
    want = torch.where(torch.tensor([True, False, True, True]), a / torch.tensor([0.1, 0.1, 0.2, 0.2]),
                       torch.tensor([1.0, -2.0, 3.0, 4.0]))  # fmt: skip
    torch.testing.assert_close(k(a), want)


def test_constant_special_values_and_errors():
    c = te.constant([float("nan"), float("inf"), -0.0], dtype="float64", name="c")
    y = te.compute((3,), lambda i: c[i] * 1.0, name="y")
    got = tailjit.build(y, [])()
    assert torch.isnan(got[0]) and got[1] == float("inf") and torch.signbit(got[2])
    with pytest.raises(te.TEError, match="too many"):
        te.constant(np.zeros(te.MAX_CONSTANT + 1))
    with pytest.raises(te.TEError, match="inputs must be te.placeholder"):
        tailjit.build(y, [c])


def test_out_of_range_constant_load_is_rejected_at_build_time():
    c = te.constant([1.0, 2.0], name="c")
    y = te.compute((3,), lambda i: c[i], name="y")
    with pytest.raises(te.TEError, match="out of bounds"):
        tailjit.build(y, [])
