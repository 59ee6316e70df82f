"""Reports of a benchmark run: live progress, summary tables, JSON / CSV, and a Markdown report with plots.

Every report is computed from result records alone (see ``docs/bench.md`` for
the schema), so it can be regenerated from a results file without running
anything.  Speedup is eager time / backend time; aggregates are geometric
means over *passing* tasks (status ``ok``); pass rates count every task whose
backend is available.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tailjit.bench.registry import TAGS, Operator

PASS = "ok"
STATUSES = ("ok", "graph-break", "wrong-result", "unsupported", "crash", "timeout", "error", "unavailable")


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def stats(records: Iterable[dict]) -> dict:
    """Pass rate, geomean speedup and failure counts of a group of records."""
    records = list(records)
    counted = [r for r in records if r["status"] != "unavailable"]
    passed = [r for r in counted if r["status"] == PASS]
    compile_times = [r["compile_s"] for r in passed if r.get("compile_s") is not None]
    return {
        "tasks": len(counted),
        "passed": len(passed),
        "pass_rate": len(passed) / len(counted) if counted else None,
        "geomean_speedup": geomean(r["speedup"] for r in passed),
        "median_compile_s": statistics.median(compile_times) if compile_times else None,
        "unavailable": len(records) - len(counted),
        "failures": dict(sorted(Counter(r["status"] for r in counted if r["status"] != PASS).items())),
    }


def _backends(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["backend"] for r in records))


def summarize(records: list[dict]) -> dict:
    """Aggregates per backend, per backend × size × mode, and per domain and per tag for each backend."""
    backends = _backends(records)
    by = lambda pred: {b: stats(r for r in records if r["backend"] == b and pred(r)) for b in backends}
    configs = sorted(
        {(r["backend"], r["size"], r["mode"]) for r in records}, key=lambda c: (backends.index(c[0]), c[1:])
    )
    domains = sorted({r["domain"] for r in records if r.get("domain")})
    return {
        "records": len(records),
        "threads": sorted({r["threads"] for r in records}),
        "backends": by(lambda r: True),
        "configs": {
            f"{b}/{s}/{m}": stats(r for r in records if (r["backend"], r["size"], r["mode"]) == (b, s, m))
            for b, s, m in configs
        },
        "domains": {d: by(lambda r, d=d: r.get("domain") == d) for d in domains},
        "tags": {t: by(lambda r, t=t: t in r.get("tags", ())) for t in TAGS},
    }


def operator_tag_counts(operators: Mapping[str, Operator]) -> dict[str, int]:
    """The syntax-feature table: how many operators carry each tag."""
    return {tag: sum(tag in op.tags for op in operators.values()) for tag in TAGS}


def _fmt_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fmt_rate(s: dict) -> str:
    if not s["tasks"]:
        return "unavailable" if s["unavailable"] else "-"
    return f"{s['passed']}/{s['tasks']} ({100 * s['pass_rate']:.0f}%)"


def _fmt_failures(failures: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in failures.items()) or "-"


def _fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


class LiveProgress:
    """A rich progress bar over the tasks; failures are printed as they happen."""

    def __init__(self, total: int, console: Console | None = None):
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.bar = self.progress.add_task("starting", total=total)

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_start(self, task) -> None:
        self.progress.update(self.bar, description=f"{task.name} {task.size} {task.mode} {task.backend}")

    def on_done(self, task, record: dict) -> None:
        if record["status"] not in (PASS, "unavailable"):
            message = record.get("message", "").splitlines()[0][:100] if record.get("message") else ""
            self.console.print(
                f"  {task.name} {task.size} {task.mode} {task.backend}: [red]{record['status']}[/] {message}",
                markup=True,
                highlight=False,
            )
        self.progress.advance(self.bar)


def print_summary(summary: dict, console: Console | None = None) -> None:
    """The end-of-run table: one row per backend, and per size × mode when there are several."""
    console = console or Console()
    rows = summary["configs"] if len(summary["configs"]) > len(summary["backends"]) else summary["backends"]
    table = Table(title=f"tailjit bench: {summary['records']} tasks, threads {summary['threads']}")
    for column in ("backend", "passed", "geomean speedup", "median compile s", "failures"):
        table.add_column(column)
    for name, s in rows.items():
        table.add_row(
            name,
            _fmt_rate(s),
            _fmt_speedup(s["geomean_speedup"]),
            _fmt_seconds(s["median_compile_s"]),
            _fmt_failures(s["failures"]),
        )
    console.print(table)


def write_json(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summarize(records), "records": records}, indent=1))


CSV_FIELDS = (
    "suite",
    "name",
    "domain",
    "tags",
    "size",
    "mode",
    "backend",
    "threads",
    "status",
    "speedup",
    "eager_s",
    "backend_s",
    "compile_s",
    "eager_spread",
    "backend_spread",
    "message",
)


def write_csv(records: list[dict], path: Path) -> None:
    """One row per record; tags joined with ``;``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            writer.writerow({**r, "tags": ";".join(r.get("tags", ()))})


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(s: dict) -> str:
    if not s["tasks"]:
        return "-"
    return f"{_fmt_speedup(s['geomean_speedup'])} ({s['passed']}/{s['tasks']})"


def markdown(records: list[dict], operators: Mapping[str, Operator] | None = None) -> str:
    """The report's text: summaries, per-domain and per-tag tables, the tag table, the failures."""
    summary = summarize(records)
    backends = list(summary["backends"])
    parts = [
        "# tailjit bench report",
        f"{summary['records']} tasks; threads {summary['threads']}. Speedup = eager time / backend time; "
        "geometric means over passing tasks (status `ok`); pass rates exclude unavailable backends.",
        "## Per backend",
        _md_table(
            ["backend", "passed", "geomean speedup", "median compile s", "failures"],
            [
                [b, _fmt_rate(s), _fmt_speedup(s["geomean_speedup"]), _fmt_seconds(s["median_compile_s"])]
                + [_fmt_failures(s["failures"])]
                for b, s in summary["backends"].items()
            ],
        ),
        "## Per backend, size and mode",
        _md_table(
            ["backend/size/mode", "passed", "geomean speedup", "failures"],
            [
                [c, _fmt_rate(s), _fmt_speedup(s["geomean_speedup"]), _fmt_failures(s["failures"])]
                for c, s in summary["configs"].items()
            ],
        ),
        "## Per domain (geomean speedup, passed/tasks)",
        _md_table(["domain", *backends], [[d, *map(_cell, row.values())] for d, row in summary["domains"].items()]),
        "## Per syntax-feature tag (geomean speedup, passed/tasks)",
        _md_table(
            ["tag", *backends],
            [
                [t, *map(_cell, row.values())]
                for t, row in summary["tags"].items()
                if any(s["tasks"] for s in row.values())
            ],
        ),
    ]
    parts += ["## Per task (speedup over eager; compile seconds in brackets)", per_task_table(records)]
    if operators is not None:
        counts = operator_tag_counts(operators)
        parts += [
            f"## Syntax features of the {len(operators)} operators",
            _md_table(
                ["tag", "operators", "share"],
                [[t, str(n), f"{100 * n / max(1, len(operators)):.0f}%"] for t, n in counts.items()],
            ),
        ]
    failed = [r for r in records if r["status"] not in (PASS, "unavailable")]
    if failed:
        parts += [
            "## Failures",
            _md_table(
                ["task", "status", "message"],
                [
                    [
                        f"{r['name']} {r['size']} {r['mode']} {r['backend']}",
                        r["status"],
                        _one_line(r.get("message")),
                    ]
                    for r in failed
                ],
            ),
        ]
    parts += [
        "## Plots",
        "![speedup distribution](speedup_distribution.png)",
        "![per-tag heatmap](tag_heatmap.png)",
        "![compile time vs speedup](compile_vs_speedup.png)",
    ]
    return "\n\n".join(parts) + "\n"


def per_task_table(records: list[dict]) -> str:
    """One row per (operator or model, size, mode): eager's median time, then each backend's speedup
    and compile time; a status other than ``ok`` is named next to the speedup it still measured."""
    backends = [b for b in _backends(records) if b != "eager"]
    rows: dict[tuple, dict[str, dict]] = {}
    for r in records:
        rows.setdefault((r["name"], r["size"], r["mode"]), {})[r["backend"]] = r

    def cell(r: dict | None) -> str:
        if r is None:
            return "-"
        if r.get("speedup") is None:
            return r["status"]
        mark = "" if r["status"] == PASS else f" {r['status']}"
        return f"{_fmt_speedup(r['speedup'])}{mark} [{_fmt_seconds(r.get('compile_s'))}]"

    body = []
    for (name, size, mode), by in rows.items():
        eager = next((r["eager_s"] for r in by.values() if r.get("eager_s")), None)
        body.append(
            [name, size, mode, "-" if eager is None else f"{eager * 1e6:.1f}", *(cell(by.get(b)) for b in backends)]
        )
    return _md_table(["task", "size", "mode", "eager us", *backends], body)


def _one_line(message: str | None) -> str:
    return (message or "").replace("\n", " ")[:160]


def plots_missing() -> str | None:
    """What to install for ``write_report``'s plots (matplotlib, an optional dependency), or None where it
    is there: the CLI asks before a run, which would otherwise end without its report."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return (
        "the report's plots need matplotlib, which is not installed: "
        'pip install matplotlib (or pip install -e ".[bench]")'
    )


def write_report(records: list[dict], directory: Path, operators: Mapping[str, Operator] | None = None) -> Path:
    """Write ``directory/report.md`` and its three PNG plots; return the Markdown path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.md"
    path.write_text(markdown(records, operators))
    _plots(records, directory)
    return path


def _plots(records: list[dict], directory: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(records)
    backends = [b for b, s in summary["backends"].items() if s["tasks"]] or list(summary["backends"])
    passed = [r for r in records if r["status"] == PASS and r.get("speedup")]

    fig, ax = plt.subplots(figsize=(1.6 * max(3, len(backends)) + 2, 4))
    data = [[r["speedup"] for r in passed if r["backend"] == b] or [math.nan] for b in backends]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(backends) + 1), backends)
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup over eager (log)")
    ax.set_title("Speedup distribution per backend (passing tasks)")
    fig.tight_layout()
    fig.savefig(directory / "speedup_distribution.png", dpi=100)
    plt.close(fig)

    tags = list(TAGS)
    fig, axes = plt.subplots(1, 2, figsize=(2 * (1.2 * len(backends) + 3), 0.45 * len(tags) + 2))
    for ax, key, title in (
        (axes[0], "pass_rate", "pass rate"),
        (axes[1], "geomean_speedup", "geomean speedup"),
    ):
        values = [[summary["tags"][t][b][key] for b in backends] for t in tags]
        if key == "pass_rate":
            colours, limits = values, (0.0, 1.0)
        else:  # log2 colour scale centred on 1x
            colours = [[None if v is None else math.log2(v) for v in row] for row in values]
            bound = max([abs(c) for row in colours for c in row if c is not None] + [1.0])
            limits = (-bound, bound)
        grid = [[math.nan if c is None else c for c in row] for row in colours]
        ax.imshow(grid, cmap="RdYlGn", vmin=limits[0], vmax=limits[1], aspect="auto")
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if v is not None:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(backends)), backends, rotation=30)
        ax.set_yticks(range(len(tags)), tags)
        ax.set_title(f"{title} per tag")
    fig.tight_layout()
    fig.savefig(directory / "tag_heatmap.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for b in backends:
        points = [(r["compile_s"], r["speedup"]) for r in passed if r["backend"] == b and r.get("compile_s")]
        if points:
            ax.scatter(*zip(*points), label=b, s=14, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("compile (first call) seconds")
    ax.set_ylabel("speedup over eager")
    ax.set_title("Compile time vs speedup (passing tasks)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "compile_vs_speedup.png", dpi=100)
    plt.close(fig)
