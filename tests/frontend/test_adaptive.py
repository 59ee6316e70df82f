"""Eager as a candidate (``tailjit/frontend/adaptive.py``): a compiled entry's first calls alternate with eager,
timed by an injected clock, and the faster one stays."""

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tailjit
from tailjit.frontend import adaptive
from tailjit.frontend.adaptive import MARGIN, ROUNDS, Trial

TRIAL = 2 * ROUNDS  # calls measured after the compiling one


class EagerClock:
    """A fake ``adaptive.clock``: a measured call that ran ``fn`` eagerly (its Python code ran: it called
    ``bump``) takes ``eager`` seconds, one that ran the compiled call ``compiled``."""

    def __init__(self, compiled: float, eager: float):
        self.compiled, self.eager = compiled, eager
        self.runs: list = []
        self.bump = self.runs.append  # (a bound builtin, which a jitted closure does not key its traces by)
        self.now, self.started = 0.0, None

    @property
    def ran(self) -> int:
        return len(self.runs)

    def __call__(self) -> float:
        if self.started is None:
            self.started = self.ran
        else:
            self.now += self.eager if self.ran > self.started else self.compiled
            self.started = None
        return self.now


def loss_with(clock):
    bump = clock.bump

    def loss(x, y):
        bump(1)
        return ((x - y) ** 2).mean()

    return loss


def no_clock():
    raise AssertionError("measured")


def no_trials(jitted) -> bool:
    return not any(isinstance(e.call, Trial) for es in jitted.entries.values() for e in es)


def test_compiled_slower_runs_eager_and_explain_says_so(monkeypatch):
    clock = EagerClock(compiled=3e-6, eager=1e-6)
    monkeypatch.setattr(adaptive, "clock", clock)
    f = tailjit.jit(loss_with(clock))
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(1 + TRIAL):
        torch.testing.assert_close(f(x, y), ((x - y) ** 2).mean())
    (choice,) = f.choices
    assert (choice.runs, choice.compiled, choice.eager) == ("eager", pytest.approx(3e-6), pytest.approx(1e-6))
    assert no_trials(f)
    before = clock.ran
    for _ in range(3):  # from now on every call runs eagerly
        assert torch.equal(f(x, y), ((x - y) ** 2).mean())
    assert clock.ran == before + 3
    text = tailjit.explain(f, x, y)
    assert "runs eager (compiled median 3.0 us > 1.1 x eager median 1.0 us" in text


def test_compiled_faster_is_kept(monkeypatch):
    clock = EagerClock(compiled=1e-6, eager=3e-6)
    monkeypatch.setattr(adaptive, "clock", clock)
    f = tailjit.jit(loss_with(clock))
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(1 + TRIAL):
        f(x, y)
    assert [c.runs for c in f.choices] == ["compiled"]
    assert no_trials(f)
    before = clock.ran
    for _ in range(3):
        assert torch.allclose(f(x, y), ((x - y) ** 2).mean())
    assert clock.ran == before  # compiled: the Python code runs no more


def test_within_the_margin_keeps_compiled(monkeypatch):
    clock = EagerClock(compiled=1e-6 * MARGIN, eager=1e-6)
    monkeypatch.setattr(adaptive, "clock", clock)
    f = tailjit.jit(loss_with(clock))
    for _ in range(1 + TRIAL):
        f(torch.randn(4), torch.randn(4))
    assert [c.runs for c in f.choices] == ["compiled"]


def test_trial_calls_alternate_whole_calls_and_equal_eager(monkeypatch):
    """Each measured call runs one candidate once: eager on every second, and an in-place update of an input
    happens once per call."""
    clock = EagerClock(compiled=3e-6, eager=1e-6)
    monkeypatch.setattr(adaptive, "clock", clock)

    bump = clock.bump

    def step(x, acc):
        bump(1)
        acc.add_(x)
        return acc * 2

    f = tailjit.jit(step)
    x, acc = torch.randn(8), torch.zeros(8)
    expect = torch.zeros(8)
    for i in range(1 + TRIAL):
        before = clock.ran
        out = f(x, acc)
        expect += x
        torch.testing.assert_close(acc, expect)
        torch.testing.assert_close(out, expect * 2)
        if i:  # (the first call traces)
            assert clock.ran - before == (i - 1) % 2
    assert [c.runs for c in f.choices] == ["eager"]


def test_adapt_false_never_measures(monkeypatch):
    monkeypatch.setattr(adaptive, "clock", no_clock)
    f = tailjit.jit(lambda x: x.sin() + 1, adapt=False)
    x = torch.randn(5)
    for _ in range(2 * TRIAL):
        torch.testing.assert_close(f(x), x.sin() + 1)
    assert f.choices == []


def test_training_calls_are_not_measured_and_train(monkeypatch):
    monkeypatch.setattr(adaptive, "clock", no_clock)
    f = tailjit.jit(lambda w, x: ((w * x).tanh() ** 2).sum())
    w0, x = torch.randn(6), torch.randn(6)
    ref = w0.clone().requires_grad_()
    ((ref * x).tanh() ** 2).sum().backward()
    for _ in range(1 + TRIAL):
        w = w0.clone().requires_grad_()
        f(w, x).backward()
        torch.testing.assert_close(w.grad, ref.grad)
    assert f.choices == []


def test_random_ops_are_not_measured(monkeypatch):
    """A seeded run must not depend on which candidate timings picked."""
    monkeypatch.setattr(adaptive, "clock", no_clock)
    f = tailjit.jit(lambda x: x + torch.rand_like(x))
    for _ in range(1 + TRIAL):
        f(torch.randn(4))
    assert f.choices == []


def test_threads_decide_once(monkeypatch):
    clock = EagerClock(compiled=1e-6, eager=1e-6)
    lock = threading.Lock()

    def locked_clock():
        with lock:
            return clock()

    # one thread's start and end reads may interleave with another's: any times will do, one decision counts
    monkeypatch.setattr(adaptive, "clock", locked_clock)
    f = tailjit.jit(lambda x: x.cos() * 3)
    x = torch.randn(16)
    f(x)
    errors = []

    def calls():
        for _ in range(4 * TRIAL):
            if not torch.allclose(f(x), x.cos() * 3):
                errors.append("wrong")

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(f.choices) == 1
    assert no_trials(f)


@pytest.mark.parametrize("runs", ["eager", "compiled"])
def test_a_closure_and_background_adapt(monkeypatch, runs):
    clock = EagerClock(compiled=3e-6, eager=1e-6) if runs == "eager" else EagerClock(compiled=1e-6, eager=3e-6)
    monkeypatch.setattr(adaptive, "clock", clock)
    scale = torch.tensor(2.0)

    bump = clock.bump

    def scaled(x):
        bump(1)
        return x * scale

    f = tailjit.jit(scaled, compile="background")
    x = torch.randn(4)
    f(x)
    assert f.wait(60)
    for _ in range(TRIAL):
        torch.testing.assert_close(f(x), x * scale)
    assert [c.runs for c in f.choices] == [runs]
    assert "eager as a candidate: " in f.state and f"scaled(float32[], float32[4]): runs {runs}" in f.state


@given(
    compiled=st.lists(st.floats(1e-7, 1e-3), min_size=ROUNDS, max_size=ROUNDS),
    eager=st.lists(st.floats(1e-7, 1e-3), min_size=ROUNDS, max_size=ROUNDS),
)
def test_a_trial_decides_once_on_the_medians(compiled, eager):
    """A ``Trial`` alone: alternate calls, one decision by the medians and the margin, then the chosen one."""
    durations = iter([d for pair in zip(compiled, eager) for d in pair])
    now = [0.0]

    def fake_clock():  # (start, end) per call: the end one later by the scripted duration
        now[0] += next(durations) if fake_clock.started else 0.0
        fake_clock.started = not fake_clock.started
        return now[0]

    fake_clock.started = False
    decisions = []
    trial = Trial(lambda x: ("compiled", x), lambda x: ("eager", x), "f", lambda c, chosen: decisions.append(c))
    original = adaptive.clock
    adaptive.clock = fake_clock
    try:
        ran = [trial(i)[0] for i in range(TRIAL)]
    finally:
        adaptive.clock = original
    assert ran == ["compiled", "eager"] * ROUNDS
    (choice,) = decisions
    medians = sorted(compiled)[ROUNDS // 2], sorted(eager)[ROUNDS // 2]
    runs = "eager" if medians[0] > MARGIN * medians[1] else "compiled"
    assert choice.runs == runs
    assert (choice.compiled, choice.eager) == (pytest.approx(medians[0]), pytest.approx(medians[1]))
    assert [trial(0)[0] for _ in range(3)] == [runs] * 3 and len(decisions) == 1
