"""Explicit schedules: every legal schedule computes the same values."""

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.schedule import Schedule


def _program():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    b = te.placeholder((m,), name="b")
    k = te.reduce_axis(m, "k")
    mean = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) / m, name="mean")
    y = te.compute((n, m), lambda i, j: te.tanh(x[i, j] - mean[i]) * b[j], name="y")
    return [x, b], y


def _ref(x, b):
    return torch.tanh(x - x.mean(1, keepdim=True)) * b


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=["j", "i"]),
        Schedule(order=["i.o", "j", "i.i"], splits={"i": 4}),
        Schedule(order=["i", "j.o", "j.i"], splits={"j": 8}, unroll={"j.i": 4}),
        Schedule(order=["i", "j"], parallel=True, parallel_work=1),
        Schedule(order=["i", "j"], parallel=False, vectorize=False),
    ],
    ids=["reordered", "split-outer", "split-inner-unrolled", "always-parallel", "serial-scalar"],
)
def test_schedules_agree(schedule):
    ins, y = _program()
    f = tailjit.build(y, ins, schedules={"y": schedule})
    torch.set_num_threads(2)
    for n, m in ((1, 1), (7, 13), (64, 33), (0, 5)):
        x, b = torch.randn(n, m), torch.randn(m)
        torch.testing.assert_close(f(x, b), _ref(x, b), rtol=1e-5, atol=1e-6)
    assert schedule.describe() in f.describe()


def test_parallel_default_is_used_on_large_inputs():
    ins, y = _program()
    f = tailjit.build(y, ins)
    torch.set_num_threads(2)
    x, b = torch.randn(2000, 300), torch.randn(300)
    torch.testing.assert_close(f(x, b), _ref(x, b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "schedule, message",
    [
        (Schedule(order=["i"]), "not a permutation"),
        (Schedule(order=["i.i", "i.o", "j"], splits={"i": 2}), "outer loop must come before"),
        (Schedule(order=["i", "j"], splits={"z": 2}), "splits unknown axis"),
        (Schedule(order=["i.o", "i.i", "j"], splits={"i": 0}), "positive int"),
    ],
)
def test_invalid_schedules(schedule, message):
    ins, y = _program()
    with pytest.raises(te.TEError, match=message):
        tailjit.build(y, ins, schedules={"y": schedule})


def test_schedule_for_unknown_kernel():
    ins, y = _program()
    with pytest.raises(te.TEError, match="not a kernel"):
        tailjit.build(y, ins, schedules={"mean": Schedule(order=["i"])})
