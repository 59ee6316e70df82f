"""Kernels equal up to their integer constants share one C function, and traced loops of any length
compile: against eager PyTorch, with what differs between kernels kept apart."""

from __future__ import annotations

import subprocess

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.bench.ops.rl import gae
from tailjit.codegen import KERNEL_MARK
from tailjit.frontend.plan.report import collect_reports
from tailjit.kernel_sharing import MIN_SHARED, share_kernels
from tailjit.runtime.compiler import toolchain
from tailjit.te.expr import TEError

KERNEL = (
    "int run_kern_t1_5(void **b, const int64_t *S, const int64_t *restrict P) {\n"
    "  float *restrict t1_5 = (float *)b[5];\n"
    "  t1_5[INT64_C(3)] = c0_1_data[0] * 0x1p+0f;\n"
    "  return INT64_C(16);\n"
    "}\n"
)


def _step(k: int) -> str:
    return KERNEL.replace("t1_5", f"t{k}_{k + 5}").replace("b[5]", f"b[{k + 5}]").replace("INT64_C(3)", f"INT64_C({k})")


def test_what_differs_becomes_a_parameter_and_the_rest_stays():
    steps = [_step(k) for k in range(MIN_SHARED)]
    other_constant = KERNEL.replace("c0_1_data", "c1_2_data")  # a file-scope array: must match exactly
    other_float = KERNEL.replace("0x1p+0f", "0x1p+1f")
    texts = [*steps, other_constant, other_float]
    names = [[f"run_kern_t{k}_{k + 5}"] for k in range(MIN_SHARED)] + [["run_kern_c"], ["run_kern_f"]]
    sharing = share_kernels(texts, names)
    assert sharing.texts[1:] == [other_constant, other_float]
    shared = sharing.texts[0]
    # the slot and the row vary: a parameter each; the unchanged literal stays
    assert "(float *)b[P[0]]" in shared and "t0_5[P[1]]" in shared and "return INT64_C(16);" in shared
    assert sharing.calls[:2] == [
        [("run_kern_t0_5", "(const int64_t[]){5, 0}")],
        [("run_kern_t0_5", "(const int64_t[]){6, 1}")],
    ]
    assert sharing.calls[-2:] == [[("run_kern_c", "NULL")], [("run_kern_f", "NULL")]]


def test_a_few_kernels_keep_their_constants_unless_equal():
    texts = [_step(1), _step(2), _step(1)]
    sharing = share_kernels(texts, [["run_kern_t1_6"], ["run_kern_t2_7"], ["run_kern_t1_6_again"]])
    assert sharing.texts == texts[:2]
    assert sharing.calls == [
        [("run_kern_t1_6", "NULL")],
        [("run_kern_t2_7", "NULL")],
        [("run_kern_t1_6", "NULL")],
    ]


def _rollout(steps, batch):
    g = torch.Generator().manual_seed(steps)
    rewards, values = torch.randn(steps, batch, generator=g), torch.randn(steps, batch, generator=g)
    rewards[steps // 2, 1], values[1, 2] = float("nan"), float("inf")
    return rewards, values, (torch.rand(steps, batch, generator=g) < 0.1).float(), torch.randn(batch, generator=g)


@pytest.mark.parametrize("steps", [2, 3, 48])
def test_a_traced_loop_shares_its_iterations_kernels(steps):
    args = _rollout(steps, 5)
    with collect_reports() as reports:
        got = tailjit.jit(gae)(*args)
    want = gae(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)
    (report,) = reports
    (kernel, _), *_ = report.kernels
    functions = kernel.source.count(KERNEL_MARK)
    # a step and an update per iteration (steps merged into one loop nest, tailjit.loop_merge, counted) ...
    assert len(kernel.kernels) + sum(len(k.merged) for k in kernel.kernels) >= 2 * steps
    if steps == 48:
        assert functions <= 8  # ... compiled as the first and last iterations and one shared middle one


def test_kernels_reading_different_constants_stay_apart():
    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0]), x * torch.tensor([4.0, 5.0, 6.0]), x * torch.tensor([7, 8, 9])

    x = torch.randn(4, 3)
    for g, w in zip(tailjit.jit(f)(x), f(x)):
        torch.testing.assert_close(g, w)


def test_loops_over_different_offsets_match_eager():
    def f(x, w):
        out = torch.zeros_like(w)
        for t in range(1, w.shape[0] - 1):
            x = torch.tanh(x * w[t - 1][:, None] + w[t + 1][:, None])
            out[t] = x.sum(1)
            out[t - 1] -= x[:, 0]
        return out, x

    x, w = torch.randn(6, 3), torch.randn(20, 6)
    got, want = tailjit.jit(f)(x, w), f(x, w)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_a_long_traced_loop_compiles_without_falling_back():
    """1000 steps: the program's tensors chain deeper than Python's recursion limit."""

    def f(x, w):
        out = torch.zeros_like(w)
        for t in range(w.shape[0]):
            x = x * 0.5 + w[t]
            out[t] = x
        return out

    x, w = torch.randn(4), torch.randn(1000, 4)
    jitted = tailjit.jit(f)
    torch.testing.assert_close(jitted(x, w), f(x, w))
    assert jitted.fallback is None


def test_a_chain_of_thousands_of_computes_builds():
    x = te.placeholder((4,), name="x")
    y = x
    for k in range(3000):
        y = te.compute((4,), lambda i, y=y: y[i] * 0.5 + 1.0, name=f"y{k}")
    want = torch.ones(4)
    for _ in range(3000):
        want = want * 0.5 + 1.0
    torch.testing.assert_close(tailjit.build(y, [x])(torch.ones(4)), want)


def test_a_body_nested_too_deeply_is_a_clear_error():
    x = te.placeholder((4,), name="x")

    def body(i):
        e = x[i]
        for _ in range(5000):
            e = e * 0.5 + 1.0
        return e

    with pytest.raises(TEError, match="nested too deeply"):
        tailjit.build(te.compute((4,), body, name="y"), [x])


def test_kernel_functions_are_not_compiled_as_entry_points(tmp_path):
    """The entry points are compiled at -O0 by a pragma; a kernel function declared under it would be
    too (gcc: "optimization attribute ... follows definition"), its scatter updates unoptimised."""

    def f(x, i):
        out = torch.zeros(8)
        out[i] = x
        return out.cumsum(0)

    with collect_reports() as reports:
        tailjit.jit(f)(torch.randn(3), torch.tensor([1, 5, 2]))
    (kernel, _), *_ = reports[0].kernels
    src = tmp_path / "unit.c"
    src.write_text(kernel.source.replace("TJ_MODULE_NAME", "unit"))
    tc = toolchain()
    proc = subprocess.run(
        [tc.cc, *(f for f in tc.flags if f != "-shared"), "-Werror=attributes", "-c", str(src), "-o", str(src) + ".o"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
