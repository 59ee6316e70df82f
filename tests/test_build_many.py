"""tailjit.api.build_many: several programs in one translation unit, one C compile."""

import numpy as np
import pytest
import torch

from tailjit import te
from tailjit.api import build_many


def _programs():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] * 2 + 1, name="y")
    m = te.var("m")
    a = te.placeholder((m, 3), name="x")  # the same tensor name as the first program's input
    k = te.reduce_axis(3, "k")
    s = te.compute((m,), lambda i: te.sum(a[i, k], axis=k), name="y")
    return [([y], [x], "first"), ([s], [a], "second")]


def test_programs_share_one_compile_and_stay_separate():
    first, second = build_many(_programs())
    assert first.source is second.source and first.build_info is second.build_info
    assert "tj_call_0" in first.source and "tj_call_1" in first.source
    x = torch.randn(7)
    torch.testing.assert_close(first(x), x * 2 + 1)
    a = torch.randn(5, 3)
    torch.testing.assert_close(second(a), a.sum(1))
    # the Python paths (numpy, out=) go to each program's own fallback
    np.testing.assert_allclose(second(a.numpy()), a.sum(1).numpy(), rtol=1e-6)
    out = torch.empty(7)
    first(x, out=out)
    torch.testing.assert_close(out, x * 2 + 1)
    with pytest.raises(ValueError, match="kernel 'second'"):
        second(torch.randn(5, 4))


def test_one_program_is_built_like_build():
    from tailjit import build

    (one,) = build_many(_programs()[:1])
    y, x, name = _programs()[0]
    assert one.source == build(y, x, name).source


def test_equal_programs_share_one_entry_point():
    a, b, c = build_many(_programs()[:1] * 2 + _programs()[1:])
    assert a.source.count("static PyObject *tj_call_") == 2  # the duplicate is generated once
    x = torch.randn(4)
    torch.testing.assert_close(a(x), b(x))
