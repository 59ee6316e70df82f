"""Reports from synthetic records: aggregates, Markdown, plots, JSON / CSV, and the CLI's --from-results."""

from __future__ import annotations

import argparse
import csv
import json
import sys

import pytest
import torch
from rich.console import Console

from tailjit.bench import cli, report, runner
from tailjit.bench.registry import Operator


def _record(name, backend, status, speedup=None, *, domain="boxes", tags=("view",), compile_s=0.5):
    return {
        "suite": "ops",
        "name": name,
        "domain": domain,
        "tags": list(tags),
        "size": "small",
        "mode": "fw",
        "backend": backend,
        "threads": 1,
        "seed": 0,
        "status": status,
        "message": "" if status == "ok" else f"{status} in {name}",
        "compile_s": compile_s if status == "ok" else None,
        "eager_s": 1e-3,
        "backend_s": 1e-3 / speedup if speedup else None,
        "speedup": speedup,
        "eager_spread": 0.01,
        "backend_spread": 0.02,
        "info": {},
    }


RECORDS = [
    _record("iou", "eager", "ok", 1.0),
    _record("nms", "eager", "ok", 1.0, domain="nms", tags=("loop", "view")),
    _record("focal", "eager", "ok", 1.0, domain="loss", tags=("reduction",)),
    _record("iou", "inductor", "ok", 2.0, compile_s=3.0),
    _record("nms", "inductor", "graph-break", 0.5, domain="nms", tags=("loop", "view")),
    _record("focal", "inductor", "ok", 8.0, domain="loss", tags=("reduction",), compile_s=5.0),
    _record("iou", "tvm", "unavailable"),
    _record("focal", "torchscript", "wrong-result", domain="loss", tags=("reduction",)),
]


def _op(name, domain, tags):
    return Operator(name, domain, lambda x: x, lambda size, gen: (torch.ones(1),), frozenset(tags), "test")


OPERATORS = {
    "iou": _op("iou", "boxes", ("view",)),
    "nms": _op("nms", "nms", ("loop", "view")),
    "focal": _op("focal", "loss", ("reduction",)),
}


def test_summary_numbers():
    summary = report.summarize(RECORDS)
    inductor = summary["backends"]["inductor"]
    assert (inductor["tasks"], inductor["passed"]) == (3, 2)
    assert inductor["geomean_speedup"] == pytest.approx(4.0)  # sqrt(2 * 8); the graph break is excluded
    assert inductor["failures"] == {"graph-break": 1}
    assert inductor["median_compile_s"] == pytest.approx(4.0)
    tvm = summary["backends"]["tvm"]
    assert (tvm["tasks"], tvm["unavailable"], tvm["pass_rate"]) == (0, 1, None)
    assert summary["tags"]["view"]["inductor"]["pass_rate"] == pytest.approx(0.5)
    assert summary["tags"]["reduction"]["inductor"]["geomean_speedup"] == pytest.approx(8.0)
    assert summary["domains"]["loss"]["torchscript"]["failures"] == {"wrong-result": 1}
    assert summary["configs"]["inductor/small/fw"]["passed"] == 2


def test_geomean_ignores_missing_values():
    assert report.geomean([2.0, None, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None


def test_markdown_report_and_plots(tmp_path):
    path = report.write_report(RECORDS, tmp_path / "rep", OPERATORS)
    text = path.read_text()
    assert "| inductor | 2/3 (67%) | 4.00x | 4.00 | graph-break 1 |" in text
    assert "| tvm | unavailable | - | - | - |" in text
    assert "| reduction | 1.00x (1/1) | 8.00x (1/1) | - | - (0/1) |" in text
    assert "| view | 2 | 67% |" in text  # syntax-feature table from Operator.tags
    assert "wrong-result in focal" in text
    for png in ("speedup_distribution.png", "tag_heatmap.png", "compile_vs_speedup.png"):
        data = (tmp_path / "rep" / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"({png})" in text


def test_json_and_csv(tmp_path):
    report.write_json(RECORDS, tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["summary"]["backends"]["inductor"]["geomean_speedup"] == pytest.approx(4.0)
    assert len(data["records"]) == len(RECORDS)
    report.write_csv(RECORDS, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(rows) == len(RECORDS)
    assert rows[1]["tags"] == "loop;view" and float(rows[3]["speedup"]) == 2.0


def test_summary_table_and_live_progress_print():
    console = Console(record=True, width=200)
    report.print_summary(report.summarize(RECORDS), console)
    with report.LiveProgress(2, console) as live:
        for record in RECORDS[3:5]:
            task = argparse.Namespace(name=record["name"], size="small", mode="fw", backend="inductor")
            live.on_start(task)
            live.on_done(task, record)
    text = console.export_text()
    assert "4.00x" in text and "2/3 (67%)" in text
    assert "nms small fw inductor: graph-break" in text


def test_cli_regenerates_reports_from_results(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--from-results", str(results), "--report", str(tmp_path / "rep"), "--csv", str(tmp_path / "r.csv")]
    )
    assert cli.main(args) == 0
    assert "4.00x" in (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("from_results", [False, True])
def test_cli_report_without_matplotlib_says_what_to_install_before_running(tmp_path, monkeypatch, capsys, from_results):
    """``--report`` without matplotlib ran the whole benchmark, then died with ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("the benchmark ran"))
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    source = ["--from-results", str(results)] if from_results else ["--results", str(tmp_path / "new.jsonl")]
    assert cli.main(parser.parse_args([*source, "--report", str(tmp_path / "rep")])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "matplotlib, which is not installed: pip install matplotlib" in out
    assert not (tmp_path / "rep").exists() and not (tmp_path / "new.jsonl").exists()


def test_default_subset_covers_every_domain_and_tag():
    ops = {
        "a": _op("a", "d1", ("view",)),
        "b": _op("b", "d1", ("view", "loop", "branch")),
        "c": _op("c", "d2", ("reduction",)),
        "d": _op("d", "d2", ("inplace",)),
        "e": _op("e", "d3", ()),
    }
    subset = cli.default_subset(ops)
    assert subset == ["b", "c", "d", "e"]  # b: most tags in d1; c: d2 by name; d: inplace; e: d3
    assert cli.default_subset(ops) == subset


def test_per_task_table():
    table = report.per_task_table(RECORDS)
    lines = table.splitlines()
    assert lines[0].startswith("| task | size | mode | eager us |") and "eager |" not in lines[0].split("eager us")[1]
    names = {r["name"] for r in RECORDS}
    assert len(lines) == 2 + len(names)  # header, rule, one row per task
    for r in RECORDS:
        if r["backend"] != "eager" and r["speedup"]:
            row = next(ln for ln in lines if ln.startswith(f"| {r['name']} |"))
            assert f"{r['speedup']:.2f}x" in row
    assert "## Per task" in report.markdown(RECORDS)
