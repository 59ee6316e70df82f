"""Compile time of one backend against another's, per task, from a ``tailjit bench --results`` file, for the
tasks both passed: ``compile_s`` (prepare + first call, so it includes one run of the task; with
``--compile-repeats N`` the median of N cold compiles), the first compile alone (``info["compile_samples"][0]``,
the same as ``compile_s`` without repeats), and ``compile_s`` less that backend's own median call
(``compile_s - backend_s``: the compile alone, estimated).  Prints each task's three ratios, then their medians
and how many are at most a fifth:

    python docs/scripts/compile_ratios.py fb/results.jsonl [tailjit-jit] [inductor]
"""

import json
import statistics
import sys

path = sys.argv[1]
ours = sys.argv[2] if len(sys.argv) > 2 else "tailjit-jit"
theirs = sys.argv[3] if len(sys.argv) > 3 else "inductor"
by_task: dict[tuple, dict] = {}
with open(path) as f:
    for line in f:
        r = json.loads(line)
        if r["status"] == "ok" and r["backend"] in (ours, theirs) and r.get("compile_s") is not None:
            by_task.setdefault((r["name"], r["size"], r["mode"]), {})[r["backend"]] = r


def first(r: dict) -> float:
    return r["info"].get("compile_samples", [r["compile_s"]])[0]


def net(r: dict) -> float:
    return max(r["compile_s"] - r["backend_s"], 0.0)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


columns = (("compile_s", lambda r: r["compile_s"]), ("first compile", first), ("less a call", net))
rows = []
for key, rs in sorted(by_task.items()):
    if ours in rs and theirs in rs:
        rows.append((key, [(f(rs[ours]), f(rs[theirs])) for _, f in columns]))
print(f"{'task':36}" + "".join(f" {label:>18} {'ratio':>6}" for label, _ in columns))
for (name, size, mode), pairs in rows:
    cells = "".join(f" {f'{a:.3f} / {b:.3f}':>18} {ratio(a, b):6.3f}" for a, b in pairs)
    print(f"{f'{name} {size} {mode}':36}{cells}")
for i, (label, _) in enumerate(columns):
    ratios = [ratio(*pairs[i]) for _, pairs in rows]
    if ratios:
        fifth = sum(x <= 0.2 for x in ratios)
        print(f"{label}: median ratio {statistics.median(ratios):.3f}, at most a fifth on {fifth}/{len(ratios)}")
