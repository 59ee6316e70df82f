"""``tailjit.jit(fn, compile="background")``: eager calls while a thread compiles, then the compiled function.

The compile is held at its C build by an event (``blocked_build``), so what a call does while it runs is
tested without timing anything."""

import threading
import warnings

import pytest
import torch

import tailjit
from tailjit.frontend.jit import JitFunction
from tailjit.frontend.plan import planner as graph
from tailjit.runtime.compiler import CompileError


def loss(pred, target):
    d = (pred - target).abs()
    return torch.where(d < 1, 0.5 * d * d, d - 0.5).mean()


@pytest.fixture
def blocked_build(monkeypatch):
    """Every C build waits for ``release`` (set at the end of the test in any case); ``entered`` is set once
    one started; ``count`` counts them."""
    entered, release, count = threading.Event(), threading.Event(), []
    build_many = graph.build_many

    def blocked(specs):
        count.append(1)
        entered.set()
        assert release.wait(120), "the test never released the build"
        return build_many(specs)

    monkeypatch.setattr(graph, "build_many", blocked)
    yield entered, release, count
    release.set()


def test_calls_run_eagerly_while_the_compile_runs_then_the_compiled_function(blocked_build):
    entered, release, count = blocked_build
    f = tailjit.jit(loss, compile="background")
    assert f.state.startswith("eager: not called yet")
    a, b = torch.randn(64, 8), torch.randn(64, 8)
    assert torch.equal(f(a, b), loss(a, b))  # returns while the build is held
    assert entered.wait(120)
    assert f.state.startswith("eager: compiling in the background")
    assert torch.equal(f(a, b), loss(a, b))
    assert not f.entries  # the held compile has made no entry yet
    release.set()
    assert f.wait(120)
    assert f.state.startswith("compiled: 1 background") and len(f.reports) == 1 and len(count) == 1
    torch.testing.assert_close(f(a, b), loss(a, b))
    assert len(count) == 1  # the compiled entry serves the call


def test_the_first_call_writes_into_its_inputs_once(blocked_build):
    entered, release, _ = blocked_build

    def bump(x):
        x.add_(1)
        return x * 2

    f = tailjit.jit(bump, compile="background")
    x = torch.zeros(5)
    assert torch.equal(f(x), torch.full((5,), 2.0)) and torch.equal(x, torch.ones(5))
    assert entered.wait(120)
    release.set()
    assert f.wait(120)
    assert torch.equal(x, torch.ones(5))  # the compile's first call wrote into a copy
    assert torch.equal(f(x), torch.full((5,), 4.0)) and torch.equal(x, torch.full((5,), 2.0))


def test_a_new_signature_runs_eagerly_while_it_compiles(blocked_build):
    entered, release, count = blocked_build
    f = tailjit.jit(loss, compile="background")
    a, b = torch.randn(8, 2), torch.randn(8, 2)
    f(a, b)
    release.set()
    assert f.wait(120)
    release.clear()
    entered.clear()
    c, d = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    assert torch.equal(f(c, d), loss(c, d))  # a new signature: eager, its build held
    assert entered.wait(120)
    assert f.state.startswith("eager: compiling in the background")
    torch.testing.assert_close(f(a, b), loss(a, b))  # the first signature's entry serves meanwhile
    assert len(count) == 2
    release.set()
    assert f.wait(120) and f.compiles == 2
    torch.testing.assert_close(f(c, d), loss(c, d))
    assert len(count) == 2 and len(f.reports) == 2


def test_arguments_that_share_memory_are_copied_sharing_it(blocked_build):
    _, release, _ = blocked_build
    release.set()

    def f(x, y):
        return (x @ y.t()).relu()  # an extern mm: the entry's guard holds the strides

    g = tailjit.jit(f, compile="background")
    base = torch.randn(6, 6)
    x, y = base[1:4, 1:4], base[:3, ::2]
    g(x, y)
    assert g.wait(120)
    torch.testing.assert_close(g(x, y), f(x, y))
    assert g.compiles == 1  # the copies' entry serves the call: same strides, offsets and sharing


def test_training_before_and_after_the_swap(blocked_build):
    entered, release, _ = blocked_build
    f = tailjit.jit(loss, compile="background")
    target = torch.randn(32, 4)

    def grads(fn):
        pred = torch.linspace(-3, 3, 128).reshape(32, 4).requires_grad_()
        out = fn(pred, target)
        out.backward()
        return out.detach(), pred.grad

    want = grads(loss)
    got = grads(f)  # eager, the build held
    assert f.thread is not None
    torch.testing.assert_close(got, want)
    assert entered.wait(120)
    release.set()
    assert f.wait(120)
    assert len(f.reports) == 1 and "differentiated" in f.reports[0].note  # a training trace, compiled
    torch.testing.assert_close(grads(f), want)


def test_a_failed_compile_leaves_eager_and_warns_once(monkeypatch):
    def failing(self, *args, **kwargs):
        raise CompileError("gcc: internal compiler error")

    monkeypatch.setattr(JitFunction, "_compile", failing)
    f = tailjit.jit(loss, compile="background")
    a, b = torch.randn(16, 3), torch.randn(16, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(f(a, b), loss(a, b))
        assert not f.wait(120)
        outs = [f(a, b) for _ in range(3)]
    assert all(torch.equal(o, loss(a, b)) for o in outs)
    told = [str(w.message) for w in caught if "background compile" in str(w.message)]
    assert len(told) == 1 and "CompileError: gcc: internal compiler error" in told[0], told
    assert caught[0].filename == __file__  # the warning points at the call
    assert f.state.startswith("eager: the background compile failed (CompileError")


def test_a_call_that_fails_eagerly_starts_no_compile():
    f = tailjit.jit(loss, compile="background")
    with pytest.raises(RuntimeError, match="size of tensor"):
        f(torch.ones(3), torch.ones(4))
    assert f.thread is None and f.state.startswith("eager: not called yet")
    assert torch.equal(f(torch.ones(3), torch.zeros(3)), torch.tensor(0.5))  # a right call does
    assert f.wait(120) and f.compiles == 1


def test_threads_calling_at_once_start_one_compile(blocked_build):
    entered, release, count = blocked_build
    f = tailjit.jit(loss, compile="background")
    a, b = torch.randn(64, 8), torch.randn(64, 8)
    want = loss(a, b)
    results, start = [], threading.Barrier(6)

    def call():
        start.wait()
        results.append(f(a, b))

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 6 and all(torch.equal(r, want) for r in results)  # all returned, the build held
    assert entered.wait(120)
    release.set()
    assert f.wait(120)
    assert len(count) == 1 and len(f.reports) == 1


def test_explain_says_which_version_runs(blocked_build):
    entered, release, _ = blocked_build
    f = tailjit.jit(loss, compile="background")
    a, b = torch.randn(8, 2), torch.randn(8, 2)
    assert "runs eager: not called yet" in tailjit.explain(f, a, b, entry="jit")
    assert "runs eager: compiling in the background" in tailjit.explain(f, a, b, entry="jit")
    release.set()
    assert f.wait(120)
    text = tailjit.explain(f, a, b, entry="jit")
    assert "runs compiled" in text and "1 graph(s) compiled" in text


def test_compile_must_be_now_or_background():
    with pytest.raises(ValueError, match="compile must be one of"):
        tailjit.jit(loss, compile="later")


def test_a_module_trains_in_both_phases(blocked_build):
    entered, release, _ = blocked_build
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref.load_state_dict(net.state_dict())
    f = tailjit.jit(net, compile="background")
    opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def step(model, opt):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    assert torch.equal(step(f, opt), step(ref, ref_opt))  # eager, the build held
    assert entered.wait(120)
    assert torch.equal(step(f, opt), step(ref, ref_opt))
    release.set()
    assert f.wait(120) and f.compiles == 1
    for _ in range(3):  # compiled: the optimizer's in-place steps reach the trace's inputs
        torch.testing.assert_close(step(f, opt), step(ref, ref_opt))
    assert f.compiles == 1 and f.thread is None and len(f.reports) == 1  # the compiled entry served them
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
