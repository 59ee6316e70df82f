"""The compiler's own benchmark (``tailjit bench --suite core``).

Four measurements, each interleaved against its eager baseline in one
process (see :mod:`tailjit.bench.timing`):

1. per-call time of a built 10-op fused element-wise kernel on 512 float32
   values, output allocation included, against one eager ``torch.add`` and
   against the eager 10-op chain;
2. the same kernel on 16M values as GB/s, against the copy bandwidth
   (``torch.Tensor.copy_``) measured in the same run;
3. row softmax on 4096x1024 against ``torch.softmax``;
4. build time: cold (a fresh cache, median over distinct kernels) and warm
   (from the disk cache, in a new process).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

import torch
from rich.console import Console
from rich.table import Table

import tailjit
from tailjit import te
from tailjit.bench.timing import interleaved

CHAIN = 10


def chain_program(salt: float = 0.0):
    """y = ten fused element-wise steps over a and b (``salt`` makes distinct kernels)."""
    n = te.var("n")
    a, b = te.placeholder((n,), name="a"), te.placeholder((n,), name="b")

    def body(i):
        v = a[i]
        for step in range(CHAIN):
            v = _step(v, b[i], step, salt, te)
        return v

    return [a, b], te.compute((n,), body, name="chain10")


def _step(v, b, step, salt, lib):
    """One op of the chain, written once for te and torch."""
    if step % 5 == 4:
        return lib.maximum(v, b) if lib is te else torch.maximum(v, b)
    if step % 2 == 0:
        return v * (1.0001 + salt) + b
    return v - b * 0.5


def chain_eager(a, b):
    v = a
    for step in range(CHAIN):
        v = _step(v, b, step, 0.0, torch)
    return v


def softmax_program():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - row_max[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    return [x], te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")


WARM_SCRIPT = textwrap.dedent(
    """
    import gc, sys, time, tailjit
    from tailjit.bench.core import chain_program
    ins, y = chain_program(float(sys.argv[1]))
    # importing torch leaves about a million objects for the cyclic GC: its next full pass (about 50 ms)
    # lands wherever the allocation count crosses the threshold, often inside the first build; run it first
    gc.collect()
    start = time.perf_counter()
    f = tailjit.build(y, ins)
    print(time.perf_counter() - start, f.build_info.cache)
    """
)


def measure(threads: int = 2, quick: bool = False) -> dict:
    torch.set_num_threads(threads)
    res: dict = {"threads": threads}
    reps = 7 if quick else 15

    ins, y = chain_program()
    chain = tailjit.build(y, ins)
    a, b = torch.randn(512), torch.randn(512)
    torch.testing.assert_close(chain(a, b), chain_eager(a, b))
    t = interleaved(
        {
            "tailjit": lambda: chain(a, b),
            "torch.add": lambda: torch.add(a, b),
            "eager chain": lambda: chain_eager(a, b),
        },
        repeats=reps,
    )
    res["small"] = {k: v.median for k, v in t.items()}

    n = 1 << 24
    a, b = torch.randn(n), torch.randn(n)
    src, dst = torch.randn(n), torch.empty(n)
    out = torch.empty(n)
    t = interleaved(
        {"tailjit": lambda: chain(a, b, out=out), "copy": lambda: dst.copy_(src)},
        repeats=5 if quick else 9,
        batch_s=0.1,
    )
    res["bandwidth"] = {
        "tailjit_GBps": 3 * 4 * n / t["tailjit"].median / 1e9,
        "copy_GBps": 2 * 4 * n / t["copy"].median / 1e9,
    }

    ins, y = softmax_program()
    softmax = tailjit.build(y, ins)
    x = torch.randn(4096, 1024)
    torch.testing.assert_close(softmax(x), torch.softmax(x, 1))
    t = interleaved(
        {"tailjit": lambda: softmax(x), "torch.softmax": lambda: torch.softmax(x, 1)},
        repeats=5 if quick else 11,
        batch_s=0.1,
    )
    res["softmax"] = {k: v.median for k, v in t.items()}

    res["compile"] = compile_times(3 if quick else 7)
    return res


def compile_times(count: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tailjit-bench-cache-") as cache:
        old = os.environ.get("TAILJIT_CACHE_DIR")
        os.environ["TAILJIT_CACHE_DIR"] = cache
        try:
            cold = []
            for salt in range(1, count + 1):
                ins, y = chain_program(salt * 1e-4)
                cold.append(tailjit.build(y, ins).build_seconds)
            salt = 1e-4  # cold[0]'s kernel, now on disk in this cache
            warm = []
            for _ in range(count):
                cmd = [sys.executable, "-c", WARM_SCRIPT, repr(salt)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                seconds, how = out.stdout.split()
                assert how == "disk", how
                warm.append(float(seconds))
        finally:
            if old is None:
                os.environ.pop("TAILJIT_CACHE_DIR", None)
            else:
                os.environ["TAILJIT_CACHE_DIR"] = old
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm), "builds": count}


def report(res: dict, console: Console) -> None:
    table = Table(title=f"tailjit core benchmark ({res['threads']} threads, medians of interleaved runs)")
    table.add_column("measurement")
    table.add_column("tailjit", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    s = res["small"]
    table.add_row("10-op chain, 512 f32 vs torch.add", f"{s['tailjit'] * 1e6:.2f} us", f"{s['torch.add'] * 1e6:.2f} us",
                  f"{s['torch.add'] / s['tailjit']:.2f}x", ">= 1.0x")  # fmt: skip
    table.add_row("10-op chain, 512 f32 vs eager chain", f"{s['tailjit'] * 1e6:.2f} us",
                  f"{s['eager chain'] * 1e6:.2f} us", f"{s['eager chain'] / s['tailjit']:.2f}x", "")  # fmt: skip
    bw = res["bandwidth"]
    table.add_row("10-op chain, 16M f32 (GB/s)", f"{bw['tailjit_GBps']:.1f}", f"{bw['copy_GBps']:.1f} (copy)",
                  f"{bw['tailjit_GBps'] / bw['copy_GBps']:.0%}", ">= 70%")  # fmt: skip
    sm = res["softmax"]
    table.add_row("row softmax 4096x1024", f"{sm['tailjit'] * 1e3:.2f} ms", f"{sm['torch.softmax'] * 1e3:.2f} ms",
                  f"{sm['torch.softmax'] / sm['tailjit']:.2f}x", ">= 1.0x")  # fmt: skip
    c = res["compile"]
    table.add_row("build, cold (median)", f"{c['cold_s'] * 1e3:.0f} ms", "", "", "<= 500 ms")
    table.add_row("build, warm from disk, new process", f"{c['warm_s'] * 1e3:.1f} ms", "", "", "<= 20 ms")
    console.print(table)


def main(args) -> int:
    console = Console()
    threads = getattr(args, "threads", None) or 2
    res = measure(threads=threads, quick=not getattr(args, "full", False))
    report(res, console)
    path = getattr(args, "json", None)
    if path:
        with open(path, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0
