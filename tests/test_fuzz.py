"""The differential fuzzer: a short seeded run against both entries, and checks that its checker, worker and
campaign catch what they are for (a wrong value, a mutation, a view, an error, a segfault, a hang)."""

import re
import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailjit.fuzz import ops
from tailjit.fuzz.builder import Builder
from tailjit.fuzz.campaign import Campaign
from tailjit.fuzz.check import Failure, check, close, is_dynamo, load
from tailjit.fuzz.programs import programs
from tailjit.fuzz.values import sprinkle
from tailjit.fuzz.worker import Worker

QUICK = settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


@QUICK
@given(programs())
def test_tailjit_matches_eager_on_random_programs(program):
    failures = [f for f in check(program.source()) if not is_dynamo(f)]
    assert not failures, program.source() + "\n".join(f"{f.entry} {f.kind}: {f.message}" for f in failures)


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_a_rendered_program_runs_as_drawn(program):
    ns = load(program.source())
    inputs = ns["make_inputs"]()
    assert len(inputs) == len(program.args)
    try:
        out = ns["fn"](*inputs)
    except Exception:
        assert program.raises
    else:
        assert not program.raises and len(out) == len(program.outputs)


PROGRAM = """
import torch
from tailjit.fuzz.values import gen

def make_inputs():
    return [torch.randn((3, 4), generator=gen(1)), torch.randint(0, 3, (2,), generator=gen(2))]

def fn(p0, p1):
    t0 = p0.t()
    t1 = torch.exp(p0[p1]).sum(1)
    return (t0, t1)

TOLERANCE = dict(reduce_len=4, magnitude=50.0, mutates=False)
"""


def _entry(change):
    return {"broken": lambda fn: lambda *args: change(fn, *args)}


def _raise(e):
    raise e


def _kinds(source, change) -> set:
    return {f.kind for f in check(source, _entry(change))}


def test_the_checker_reports_each_kind_of_difference():
    assert _kinds(PROGRAM, lambda fn, *a: fn(*a)) == set()
    assert _kinds(PROGRAM, lambda fn, *a: (fn(*a)[0], fn(*a)[1] * 1.01)) == {"value", "grad-value"}
    assert _kinds(PROGRAM, lambda fn, *a: (fn(*a)[0], fn(*a)[1].double())) == {"dtype", "grad-dtype"}
    assert _kinds(PROGRAM, lambda fn, *a: (fn(*a)[0].clone(), fn(*a)[1])) == {"alias", "grad-alias"}
    # (the backward then raises too: autograd saw the index it saved change)
    assert _kinds(PROGRAM, lambda fn, *a: (fn(*a), a[1].add_(1))[0]) == {"mutation", "grad-raised"}
    assert _kinds(PROGRAM, lambda fn, *a: (fn(*a)[0], fn(*a)[1].detach())) == {"requires-grad"}
    assert _kinds(PROGRAM, lambda fn, *a: fn(*a, None)) == {"raised", "grad-raised"}
    calls = []
    second_call_wrong = lambda fn, *a: (calls.append(1), fn(*a)[:1] if len(calls) == 2 else fn(*a))[1]
    assert _kinds(PROGRAM, second_call_wrong) == {"call2-outputs"}


def test_a_zero_where_eager_has_nan_is_a_kind_of_its_own():
    tol = dict(reduce_len=1, magnitude=1.0)
    nan = float("nan")
    assert close(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0]), tol)[0] == "nan-zero"
    assert close(torch.tensor([nan, 1.0]), torch.tensor([0.0, 2.0]), tol)[0] == "value"
    assert close(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), tol) is None


def test_the_checker_compares_errors():
    raising = PROGRAM.replace("p0[p1]", "p0[p1 + 3]")  # out of range: eager raises IndexError
    assert _kinds(raising, lambda fn, *a: fn(*a)) == set()
    assert _kinds(raising, lambda fn, *a: (a[0], a[0])) == {"missing-error"}
    assert _kinds(raising, lambda fn, *a: _raise(TypeError("not eager's type"))) == {"error-type"}


def test_the_worker_survives_a_segfault_and_a_hang():
    worker = Worker(timeout=20)
    try:
        assert worker.check("import ctypes\nctypes.string_at(0)\n")[0][0].kind == "crash"
        assert worker.check("while True:\n    pass\n")[0][0].kind == "hang"
        assert worker.check(PROGRAM) == ([], True)
    finally:
        worker.close()


def test_a_failure_is_shrunk_and_saved_as_a_runnable_reproducer(tmp_path):
    c = Campaign(tmp_path, minutes=5, seed=1, round_size=50)
    c.worker.check = lambda source: ([Failure("value", "jit", "x")] if "torch.exp(" in source else [], False)
    for n in range(20):
        c.round(n)
        if c.saved:
            break
    c.round(n + 1)  # the same kind again: counted and saved as drawn, not shrunk again
    c.worker.close()
    (path,) = c.saved
    assert c.failures[("jit", "value")] == 1 + len(list((tmp_path / "more").iterdir())) > 1
    body = load(path.read_text())["fn"].__code__
    assert "exp" in body.co_names and len(body.co_varnames) <= 3  # shrunk: one input (two for aliasing), one line
    assert path.name.endswith("-jit-value.py")


def test_special_values_keep_the_layout():
    t = sprinkle(torch.randn(20, 30), 3)
    assert t.isnan().any() and t.isinf().any() and t.shape == (20, 30)


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_gelu_is_not_drawn_where_eager_is_implementation_defined(data):
    b = Builder(data.draw, 0)
    b.param("torch.tensor([float('inf'), 1.0, -float('inf')])")
    while len(b.temps) < 8 and not b.p.raises:
        ops.unary(b)
    for operand in re.findall(r"F\.gelu\((\w+)\)", "\n".join(b.p.body)):
        assert not b.ns[operand].isinf().any()


DYNAMO_ERROR = """
import torch
import torch.nn.functional as F

def make_inputs():
    return [torch.tensor([[3, -1], [0, 2]])]

def fn(p0):
    if (p0 > 1).any():  # the jit cannot trace elu of integers speculatively: it falls back to torch.compile
        t0 = F.elu(p0)
    else:
        t0 = torch.exp(p0)
    return (t0,)

TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=False)
"""


def test_an_error_type_dynamo_changes_is_reported_as_dynamos():
    # eager raises NotImplementedError, Dynamo's fake tensors a RuntimeError (TorchRuntimeError), also through
    # its own eager backend: that is Dynamo's, for torch.compile and for the jit's fallback to it
    assert {(f.entry, f.kind) for f in check(DYNAMO_ERROR)} == {("compile(dynamo)", "error-type"),
                                                                 ("jit(dynamo)", "error-type")}  # fmt: skip


SELF_COPY = """
import torch

def make_inputs():
    return [torch.tensor([[3, -1]]).expand(2, 2)]

def fn(p0):
    p0[:] = p0
    return (p0,)

TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=True)
"""


def test_a_second_call_that_fails_as_dynamo_does_is_dynamos():
    # eager's copy_ of a tensor onto itself returns early; Dynamo's fake tensors refuse the expanded target, so
    # torch.compile raises, and tailjit.jit, whose first call ran eagerly, at its second (torch.compile's) call
    want = {("compile(dynamo)", "raised"), ("jit(dynamo)", "call2-raised")}
    assert {(f.entry, f.kind) for f in check(SELF_COPY)} == want


def test_the_command_line_needs_hypothesis_only_for_a_fuzz_run(monkeypatch, capsys):
    """`tailjit bench` in an environment without the fuzz extra died importing hypothesis."""
    import tailjit.fuzz
    from tailjit import cli

    for name in [m for m in sys.modules if m.split(".")[0] == "hypothesis" or m.startswith("tailjit.fuzz.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    monkeypatch.delattr(tailjit.fuzz, "campaign", raising=False)
    assert cli.main(["bench", "--list"]) == 0
    assert cli.main(["fuzz", "--minutes", "0"]) == 2
    assert 'pip install hypothesis (or pip install -e ".[fuzz]")' in capsys.readouterr().err
