"""The isolated runner: crash / hang isolation, resume, wrong-result detection, the comparison, the CLI.

The toy operators and backends live in a module written to a temporary
directory and imported only by the worker processes, so the registry of the
test process (which other tests check) never sees them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import statistics
import textwrap

import pytest
import torch

from tailjit.bench import runner
from tailjit.bench.runner import RunConfig, Task, load_records
from tailjit.bench.worker import compare

FAKE_SUITE = textwrap.dedent(
    '''
    """Toy operators and backends for the runner tests."""
    import os
    import time

    import torch

    from tailjit.bench.backends import Backend, Prepared, register_backend, torch_run
    from tailjit.bench.registry import operator


    def _inputs(size, gen):
        return (torch.randn(64 if size == "small" else 256, 4, generator=gen),)


    def _square_sum_jax(x):
        return (x * x).sum(1)


    @operator(domain="toy", tags=("reduction",), reference="test", inputs=_inputs,
              differentiable=True, grad_argnums=(0,), jax=_square_sum_jax)
    def toy_square_sum(x):
        return (x * x).sum(1)


    @operator(domain="toy", tags=("input-dependent", "reduction"), reference="test", inputs=_inputs)
    def toy_masked_sum(x):
        return x[x > 0].sum()


    @operator(domain="toy", tags=("loop",), reference="test", inputs=_inputs)
    def toy_hang(x):
        while True:
            time.sleep(0.05)


    class Crashy(Backend):
        name = "crashy"

        def prepare(self, work):
            return Prepared(lambda *args: os.abort())


    class OffByOne(Backend):
        name = "offbyone"

        def prepare(self, work):
            run = torch_run(work.fn, work)
            return Prepared(lambda *args: run(*args) + 0.01)


    class Specialising(Backend):
        """Like a trace: the result computed on the example inputs, whatever the inputs."""

        name = "specialising"

        def prepare(self, work):
            out = torch_run(work.fn, work)(*work.args)
            return Prepared(lambda *args: out)


    class SlowFirst(Backend):
        """Compiles a toy operator in 0.3 s the first time, then in 0.02 s, 0.04 s, ... (the warm-up's
        functions in no time)."""

        name = "slowfirst"
        compiles = 0

        def prepare(self, work):
            if work.fn.__name__.startswith("toy_"):
                SlowFirst.compiles += 1
                time.sleep(0.3 if SlowFirst.compiles == 1 else 0.02 * (SlowFirst.compiles - 1))
            return Prepared(torch_run(work.fn, work))


    register_backend(Crashy())
    register_backend(OffByOne())
    register_backend(Specialising())
    register_backend(SlowFirst())
    '''
)


@pytest.fixture
def fake_config(tmp_path, monkeypatch):
    (tmp_path / "fake_suite.py").write_text(FAKE_SUITE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return RunConfig(
        results=tmp_path / "out" / "results.jsonl",
        timeout=20.0,
        repeats=3,
        batch_s=0.002,
        imports=("fake_suite",),
    )


def _task(name: str, backend: str, mode: str = "fw", size: str = "small") -> Task:
    return Task("ops", name, size, mode, backend, domain="toy")


def test_crash_and_hang_are_recorded_and_the_run_continues(fake_config):
    fake_config.timeout = 6.0
    tasks = [
        _task("toy_square_sum", "crashy"),
        _task("toy_square_sum", "eager"),
        _task("toy_hang", "eager"),
        _task("toy_square_sum", "offbyone"),
        _task("toy_square_sum", "specialising"),
        _task("toy_square_sum", "torchscript"),
        _task("toy_square_sum", "tvm"),
    ]
    records = runner.run(tasks, fake_config)
    by_backend = {(r["name"], r["backend"]): r for r in records}
    crash = by_backend["toy_square_sum", "crashy"]
    assert crash["status"] == "crash"
    assert "SIGABRT" in crash["message"]
    assert by_backend["toy_square_sum", "eager"]["status"] == "ok"
    hang = by_backend["toy_hang", "eager"]
    assert hang["status"] == "timeout"
    assert hang["wall_s"] >= 6.0
    wrong = by_backend["toy_square_sum", "offbyone"]
    assert wrong["status"] == "wrong-result"
    assert "elements differ" in wrong["message"]
    specialised = by_backend["toy_square_sum", "specialising"]
    assert specialised["status"] == "wrong-result"
    assert specialised["message"].startswith("second input set (seed 1)")
    script = by_backend["toy_square_sum", "torchscript"]
    assert script["status"] == "ok" and script["info"]["method"] == "script"
    assert script["speedup"] == pytest.approx(script["eager_s"] / script["backend_s"])
    assert by_backend["toy_square_sum", "tvm"]["status"] == "unavailable"
    # Every task is on disk, one line each, with the schema's keys.
    lines = fake_config.results.read_text().splitlines()
    assert len(lines) == len(tasks)
    assert {"suite", "name", "size", "mode", "backend", "threads", "status", "speedup"} <= set(json.loads(lines[0]))


def test_forward_backward_against_jax_and_eager(fake_config):
    tasks = [_task("toy_square_sum", backend, "fwbw") for backend in ("eager", "jax")]
    tasks.append(_task("toy_hang", "eager", "fwbw"))  # not differentiable: never run
    records = runner.run(tasks, fake_config)
    status = {(r["backend"], r["name"]): r["status"] for r in records}
    assert status["eager", "toy_square_sum"] == "ok"
    assert status["jax", "toy_square_sum"] == "ok"
    assert status["eager", "toy_hang"] == "unsupported"
    assert all(r["threads"] == 1 for r in records)


@pytest.mark.slow
def test_inductor_passes_and_reports_graph_breaks(fake_config):
    tasks = [_task("toy_square_sum", "inductor", mode) for mode in ("fw", "fwbw")]
    tasks.append(_task("toy_masked_sum", "inductor"))
    # Inductor compiles for many seconds on a loaded 2-core machine: not what this test is about
    config = dataclasses.replace(fake_config, timeout=600.0)
    status = {(r["name"], r["mode"]): r for r in runner.run(tasks, config)}
    for mode in ("fw", "fwbw"):
        record = status["toy_square_sum", mode]
        assert record["status"] == "ok" and record["info"]["graph_breaks"] == 0
        assert record["compile_s"] > 0 and record["speedup"] > 0
    masked = status["toy_masked_sum", "fw"]
    assert masked["status"] == "graph-break" and masked["info"]["graph_breaks"] >= 1


def test_compile_time_is_the_median_of_cold_compiles(fake_config):
    config = dataclasses.replace(fake_config, compile_repeats=3)
    (record,) = runner.run([_task("toy_square_sum", "slowfirst")], config)
    samples = record["info"]["compile_samples"]
    assert record["status"] == "ok" and len(samples) == 3
    assert samples[0] >= 0.3 and max(samples[1:]) < 0.3  # the first compile is the one measured first
    assert record["compile_s"] == statistics.median(samples)
    (single,) = runner.run([_task("toy_square_sum", "slowfirst", size="large")], fake_config)
    assert "compile_samples" not in single["info"] and single["compile_s"] >= 0.3


def test_cold_compiles_stop_at_the_budget_and_caches_are_emptied(tmp_path, monkeypatch):
    from tailjit.bench import worker

    (tmp_path / "fake_suite.py").write_text(FAKE_SUITE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fake_suite")
    inductor, tailjit = tmp_path / "inductor", tmp_path / "inductor" / "tailjit"  # nested, as the runner has them
    for d in (inductor / "fxgraph", inductor / "ab", inductor / "locks", tailjit / "pch", tailjit / "3f"):
        d.mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tailjit))
    monkeypatch.setenv("TAILJIT_BENCH_SCRATCH", "1")
    monkeypatch.setattr(worker, "COMPILE_REPEAT_BUDGET_S", 0.5)  # the 0.3 s first compile twice is over
    task = {"suite": "ops", "name": "toy_square_sum", "size": "small", "mode": "fw", "backend": "slowfirst",
            "seed": 0, "repeats": 3, "batch_s": 0.002, "timing_budget_s": 0.1, "compile_repeats": 5}  # fmt: skip
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    make_fx(lambda x: x.exp() + 1, tracing_mode="fake")(torch.ones(3, 5))  # fills fake tensors' dispatch cache
    assert FakeTensorMode.cache
    record = worker.Worker().run(task)
    assert record["status"] == "ok" and "compile_samples" not in record["info"] and record["compile_s"] >= 0.3
    assert not FakeTensorMode.cache
    assert sorted(p.name for p in inductor.iterdir()) == ["locks", "tailjit"]  # tailjit's cache is not Inductor's
    assert [p.name for p in tailjit.iterdir()] == ["pch"]


def test_interrupted_run_resumes_and_fresh_reruns(fake_config):
    tasks = [_task("toy_square_sum", "eager", size=size) for size in ("small", "large")]
    started: list[str] = []

    def interrupt(task, record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run(tasks, fake_config, on_done=interrupt)
    assert [r["size"] for r in load_records(fake_config.results)] == ["small"]

    records = runner.run(tasks, fake_config, on_start=lambda t: started.append(t.size))
    assert started == ["large"]
    assert [r["size"] for r in records] == ["small", "large"]
    assert len(fake_config.results.read_text().splitlines()) == 2

    # --fresh discards the file (checked with a task that needs no worker).
    fake_config.fresh = True
    runner.run([_task("toy_square_sum", "tvm")], fake_config)
    assert [r["backend"] for r in load_records(fake_config.results)] == ["tvm"]


def test_unavailable_records_are_retried_on_resume(fake_config):
    task = _task("toy_square_sum", "tvm")
    runner.run([task], fake_config)
    started: list[Task] = []
    runner.run([task], fake_config, on_start=started.append)
    assert started == [task]


def test_load_records_keeps_the_last_per_key_and_skips_a_torn_line(tmp_path):
    base = {"suite": "ops", "name": "a", "size": "small", "mode": "fw", "backend": "eager", "threads": 1}
    path = tmp_path / "r.jsonl"
    path.write_text(
        json.dumps({**base, "status": "crash"}) + "\n" + json.dumps({**base, "status": "ok"}) + "\n" + '{"su'
    )
    assert [r["status"] for r in load_records(path)] == ["ok"]


@pytest.mark.parametrize(
    ("expected", "actual", "problem"),
    [
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-6]), None),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.001]), "elements differ"),
        (torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan]), None),
        (torch.tensor([1.0, math.nan]), torch.tensor([math.nan, 1.0]), "NaN positions"),
        (torch.tensor([1.0, math.inf]), torch.tensor([1.0, -math.inf]), "infinities"),
        (torch.tensor([3, 4]), torch.tensor([3, 4], dtype=torch.int32), None),
        (torch.tensor([3, 4]), torch.tensor([3, 5]), "exact match"),
        (torch.tensor([3, 4]), torch.tensor([3.0, 4.0]), "dtype"),
        (torch.ones(2, 3), torch.ones(3, 2), "shape"),
        ((torch.ones(2), [torch.zeros(1), 3]), [torch.ones(2), (torch.zeros(1), 3)], None),
        ((torch.ones(2), torch.zeros(1)), (torch.ones(2),), "sequence"),
        ({"a": torch.ones(1)}, {"b": torch.ones(1)}, "keys"),
        (torch.tensor(2.5), 2.5, None),
        (7, 8, "expected 7"),
    ],
)
def test_compare(expected, actual, problem):
    msg = compare(expected, actual)
    if problem is None:
        assert msg is None
    else:
        assert msg is not None and problem in msg


def test_compare_tolerance_scales_with_magnitude_and_grad_factor():
    big = torch.tensor([1e4, 1e-3])
    assert compare(big, big + torch.tensor([0.0, 0.05])) is None  # atol * max|e| = 0.1
    assert compare(big, big + torch.tensor([0.0, 0.5])) is not None
    small = torch.tensor([1.0])
    assert compare(small, small + 5e-4) is not None
    assert compare(small, small + 5e-4, scale=10.0) is None


def test_cli_list(capsys):
    import argparse

    from tailjit.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.main(parser.parse_args(["--list"])) == 0
    out = capsys.readouterr().out
    for backend in ("eager", "torchscript", "inductor", "jax", "tvm", "tailjit", "tailjit-jit"):
        assert backend in out
    assert "resnet18" in out
