"""One call of an ATen overload through its builtin (``op._op``, how the host called every extern op) against the
Tensor method or indexing that the host now emits, in us: ``timeit``, the minimum of 3 x 200000 calls, the
lambdas included, 1 thread.

    python docs/scripts/host_call_costs.py
"""

import timeit

import torch

torch.set_num_threads(1)
aten = torch.ops.aten
x, a = torch.randn(16, 128, 64), torch.randn(4, 4)
y = torch.randn(5, 64)
cases = {
    "select.int": (lambda: aten.select.int._op(x, 0, 3), lambda: x[3]),
    "slice.Tensor": (lambda: aten.slice.Tensor._op(x, 0, 0, 5), lambda: x[0:5]),
    "copy_": (lambda: aten.copy_.default._op(y, y), lambda: y.copy_(y)),
    "view": (lambda: aten.view.default._op(y, [5, 64]), lambda: y.view([5, 64])),
    "expand": (lambda: aten.expand.default._op(a, [2, 4, 4]), lambda: a.expand([2, 4, 4])),
    "transpose.int": (lambda: aten.transpose.int._op(a, 0, 1), lambda: a.transpose(0, 1)),
    "mm": (lambda: aten.mm.default._op(a, a), lambda: a.mm(a)),
}
for name, (builtin, method) in cases.items():
    t = [min(timeit.repeat(f, number=200000, repeat=3)) / 200000 * 1e6 for f in (builtin, method)]
    print(f"{name:14s} builtin {t[0]:.2f} us   method or indexing {t[1]:.2f} us")
