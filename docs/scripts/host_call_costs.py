"""One call of an ATen overload through its builtin (``op._op``, how the host called every extern op) against the
Tensor method or indexing that the host now emits, and the costs of reading numbers from data (below), in us:
``timeit``, the minimum of 3 x 200000 calls, the lambdas included, 1 thread.

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

# Numbers read from a small input (``h, w = hw.tolist()`` in a speculative trace): a read through its views and
# ``item()`` as the host emitted it, against one ``tolist()`` of the input a call; a float read's assertion
# through the dispatcher against one ``item()`` in Python.
flags, same = torch.tensor([0, 1, 2, 3]), torch.tensor(True)  # ``same``: the compiled ``read == value``
squeeze, item = aten.squeeze.dims._op, aten._local_scalar_dense.default._op
reads = {
    "one read: slice, squeeze, item": lambda: item(squeeze(flags[1:2], [0])),
    "four reads: tolist": lambda: flags.tolist(),
    "assertion: _assert_async.msg": lambda: aten._assert_async.msg._op(same, "m"),
    "assertion: item() in Python": lambda: same.item() or None,
}
for name, f in reads.items():
    print(f"{name:32s} {min(timeit.repeat(f, number=200000, repeat=3)) / 200000 * 1e6:.2f} us")

# tailjit.jit's per call cost of captured values (docs/jit.md): a function reading a global tensor and a global
# float (a ``JitClosure``) against the same function given the tensor as an argument and the float as a literal;
# medians of 21 interleaved repetitions (``tailjit.bench.timing.interleaved``).
import tailjit  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

OFFSET, GAIN = torch.randn(128, 4), 2.0


def captured(x):
    return (x - OFFSET) * GAIN


def passed(x, offset):
    return (x - offset) * 2.0


boxes = torch.randn(128, 4)
jit_captured, jit_passed = tailjit.jit(captured), tailjit.jit(passed)
times = interleaved({"captured": lambda: jit_captured(boxes), "passed": lambda: jit_passed(boxes, OFFSET)}, repeats=21)
for name, t in times.items():
    print(f"tailjit.jit, {name:8s} values  {t.median * 1e6:.2f} us")

# A jitted module (docs/jit.md, "Modules"): tailjit.jit of a 3-layer MLP on 8x16 inputs under no_grad, against its
# JitFunction given the parameters (what the module's generated check passes it) and against eager.
mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                          torch.nn.Linear(32, 4))  # fmt: skip
jit_mlp, inputs = tailjit.jit(mlp), torch.randn(8, 16)
with torch.no_grad():
    jit_mlp(inputs)
    weights = list(mlp.parameters())
    inner = jit_mlp.jitted
    times = interleaved({"module": lambda: jit_mlp(inputs), "parameters given": lambda: inner(*weights, inputs),
                         "eager": lambda: mlp(inputs)}, repeats=21)  # fmt: skip
for name, t in times.items():
    print(f"3-layer MLP, {name:16s} {t.median * 1e6:.2f} us")
