"""``tailjit bench``: run the long-tail suite against the peer backends and report.

Without flags it is a quick run (a fixed representative subset of operators,
small size, forward only, every backend); ``--full`` runs everything.  See
``docs/bench.md``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import time
from pathlib import Path

from rich.console import Console

from tailjit.bench import report, runner
from tailjit.bench.backends import BACKENDS, availability
from tailjit.bench.ops import all_operators
from tailjit.bench.registry import SIZES, TAGS

#: Per-task timeouts (seconds): Inductor can spend minutes on one operator with a
#: Python loop (Dynamo unrolls it, then recompiles for the second input set).
TIMEOUT = 300.0
QUICK_TIMEOUT = 90.0
FULL_HINT = "quick run over a representative subset; run everything with `tailjit bench --full`"


def _csv(text: str | None) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()] if text else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--full", action="store_true", help="all operators and models, both sizes, both modes")
    add("--list", action="store_true", help="list operators, models and backends, then exit")
    add("--ops", help="comma-separated operator or model names")
    add("--tags", help=f"comma-separated tags; operators with any of them ({', '.join(TAGS)})")
    add("--domains", help="comma-separated domains")
    add("--backends", help=f"comma-separated backends (default: all of {', '.join(BACKENDS)})")
    add("--sizes", help="comma-separated sizes: small,large (default small; --full: both)")
    add("--mode", choices=("fw", "fwbw", "both"), help="forward, forward+backward, or both (default fw)")
    add("--suite", choices=("ops", "models", "core", "autodiff", "networks", "all"),
        help="default ops; --full: all (autodiff: compiled gradients vs torch autograd; "
             "networks: training networks built from new operators, --ops picks some)")  # fmt: skip
    add("--threads", type=int, default=1, help="torch threads in the workers (default 1)")
    add(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per task before its worker is killed (default {TIMEOUT:.0f}, quick run {QUICK_TIMEOUT:.0f})",
    )
    add("--results", type=Path, default=runner.RunConfig.results, help="JSON-lines results file")
    add("--fresh", action="store_true", help="discard the results file instead of resuming")
    add("--repeats", type=int, default=15, help="interleaved timing repetitions per task")
    add(
        "--compile-repeats",
        type=_at_least_one,
        default=1,
        help="cold compiles per task (default 1); compile_s is their median (within 30 s of compiling a task)",
    )
    add("--seed", type=int, default=0, help="seed of the input generators")
    add("--json", type=Path, help="write the summary and records as JSON")
    add("--csv", type=Path, help="write the records as CSV")
    add("--report", type=Path, help="write DIR/report.md and PNG plots")
    add("--from-results", type=Path, help="report from this results file without running")


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def default_subset(operators: dict, per_domain: int = 1) -> list[str]:
    """A fixed representative subset of the registry, covering every domain and every tag in use.

    Per domain (in name order), greedily take the ``per_domain`` operators that
    add the most tags not yet covered (ties: more tags, differentiable, then
    name); then, while a tag used by some operator is still uncovered, add the
    operator covering the most missing tags.
    """
    chosen: list[str] = []
    covered: set[str] = set()

    def pick(candidates):
        best = max(candidates, key=lambda op: (len(op.tags - covered), len(op.tags), op.differentiable))
        chosen.append(best.name)
        covered.update(best.tags)

    ops = sorted(operators.values(), key=lambda op: op.name)
    for domain in sorted({op.domain for op in ops}):
        for _ in range(per_domain):
            candidates = [op for op in ops if op.domain == domain and op.name not in chosen]
            if candidates:
                pick(candidates)
    used = set().union(*(op.tags for op in ops)) if ops else set()
    while used - covered:
        pick([op for op in ops if op.tags & (used - covered)])
    return sorted(chosen)


def _models() -> dict:
    if importlib.util.find_spec("tailjit.bench.models") is None:
        return {}
    return importlib.import_module("tailjit.bench.models").MODELS


def _list(console: Console) -> int:
    operators = all_operators()
    print(f"{len(operators)} operators (name  domain  tags  [d = differentiable, j = has jax_fn]):")
    for op in operators.values():
        flags = ("d" if op.differentiable else "-") + ("j" if op.jax_fn else "-")
        print(f"  {op.name:40s} {op.domain:18s} {flags}  {','.join(sorted(op.tags))}")
    models = _models()
    print(f"{len(models)} models:")
    for spec in models.values():
        print(f"  {spec.name:40s} {'fw+fwbw' if spec.train else 'fw'}")
    print("backends:")
    for name in BACKENDS:
        reason = availability(name)
        print(f"  {name:16s} {'available' if reason is None else 'unavailable: ' + reason}")
    print("default subset: " + ",".join(default_subset(operators)))
    return 0


def select_tasks(args: argparse.Namespace, console: Console) -> list[runner.Task] | None:
    """The tasks the flags ask for (None after printing an error)."""
    suite = args.suite or ("all" if args.full else "ops")
    sizes = _csv(args.sizes) or (list(SIZES) if args.full else ["small"])
    modes = {"fw": ["fw"], "fwbw": ["fwbw"], "both": ["fw", "fwbw"]}[args.mode or ("both" if args.full else "fw")]
    backends = _csv(args.backends) or list(BACKENDS)
    bad = [s for s in sizes if s not in SIZES] + [b for b in backends if b not in BACKENDS]
    tags, domains, names = set(_csv(args.tags)), set(_csv(args.domains)), set(_csv(args.ops))
    bad += sorted(tags - set(TAGS))
    operators = all_operators() if suite in ("ops", "all") else {}
    models = _models() if suite in ("models", "all") else {}
    bad += sorted(names - set(operators) - set(models))
    if bad:
        console.print(f"[red]unknown sizes / backends / tags / names: {', '.join(bad)}[/]")
        return None
    if names or tags or domains or args.full:
        chosen = [
            op
            for op in operators.values()
            if (not names or op.name in names)
            and (not tags or op.tags & tags)
            and (not domains or op.domain in domains)
        ]
    else:
        subset = default_subset(operators)
        chosen = [operators[n] for n in subset]
        console.print(f"{FULL_HINT} ({len(subset)} of {len(operators)} operators)")
        if args.timeout is None:  # keeps the quick run within ten minutes on two cores
            args.timeout = QUICK_TIMEOUT
    if names or tags or domains:
        models = {n: m for n, m in models.items() if n in names}
    tasks = [
        runner.Task("ops", op.name, size, mode, backend, op.domain, tuple(sorted(op.tags)))
        for op in chosen
        for size in sizes
        for mode in modes
        if mode == "fw" or op.differentiable
        for backend in backends
    ]
    tasks += [
        runner.Task("models", spec.name, size, mode, backend, "model")
        for spec in models.values()
        for size in sizes
        for mode in modes
        if mode == "fw" or spec.train
        for backend in backends
    ]
    return tasks


def _outputs(args: argparse.Namespace, records: list[dict], console: Console) -> None:
    if not records:
        console.print("no results")
        return
    report.print_summary(report.summarize(records), console)
    if args.json:
        report.write_json(records, args.json)
        console.print(f"wrote {args.json}")
    if args.csv:
        report.write_csv(records, args.csv)
        console.print(f"wrote {args.csv}")
    if args.report:
        path = report.write_report(records, args.report, all_operators())
        console.print(f"wrote {path} and plots")


def _core(args: argparse.Namespace, console: Console) -> int:
    if importlib.util.find_spec("tailjit.bench.core") is None:
        console.print("the core suite (tailjit.bench.core) is not available yet")
        return 1
    return int(importlib.import_module("tailjit.bench.core").main(args) or 0)


def main(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # logs and pipes: do not squeeze the tables to 80 columns
        console.width = max(console.width, 140)
    if args.list:
        return _list(console)
    missing = report.plots_missing() if args.report else None
    if missing:
        console.print(f"[red]--report: {missing}[/]")
        return 2
    if args.from_results:
        _outputs(args, runner.load_records(args.from_results), console)
        return 0
    if args.suite == "core":
        return _core(args, console)
    if args.suite in ("autodiff", "networks"):
        return int(importlib.import_module(f"tailjit.bench.{args.suite}").main(args) or 0)
    tasks = select_tasks(args, console)
    if tasks is None:
        return 2
    config = runner.RunConfig(
        results=args.results,
        threads=args.threads,
        timeout=args.timeout or TIMEOUT,
        seed=args.seed,
        fresh=args.fresh,
        repeats=args.repeats,
        compile_repeats=args.compile_repeats,
    )
    start = time.perf_counter()
    with report.LiveProgress(len(tasks), console) as live:
        records = runner.run(tasks, config, on_start=live.on_start, on_done=live.on_done)
    console.print(f"{len(tasks)} tasks in {time.perf_counter() - start:.0f} s; results in {args.results}")
    _outputs(args, records, console)
    if (args.suite or ("all" if args.full else "ops")) == "all":
        _core(args, console)
    return 0
