"""Compiled gradients against torch autograd (``tailjit bench --suite autodiff``).

For a few operators written as tensor expressions, the backward alone is
timed, interleaved (:mod:`tailjit.bench.timing`): tailjit's gradient kernel
(built by ``te.gradient``, called directly with the inputs, the saved
outputs, the reductions the forward saved for it as ``@tailjit.op`` does,
and the output gradient) against ``torch.autograd.grad`` on the same
operator written with torch ops (the composite whose graph autograd
differentiates) and, where torch has one, on its fused operator.  Forward
plus backward is timed too, through a differentiable built kernel and
through torch's fused operator: a fused backward can lean on what its
forward saved at a price (max pooling's argmax indices), so the training
call is the fair comparison.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import tailjit
from tailjit import te
from tailjit.bench.timing import interleaved
from tailjit.runtime.kernel import gradient_spec


@dataclass
class Case:
    name: str
    program: Callable  # () -> (placeholders, output), float32
    composite: Callable  # torch ops, differentiated by autograd
    fused: Callable | None  # torch's own operator, if any
    shapes: list[tuple[int, ...]]


def _softmax():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    # the result does not depend on the maximum it subtracts: no gradient through it
    mx = te.stop_gradient(te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max"))
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    return [x], te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")


def _softmax_torch(x):
    e = torch.exp(x - x.amax(1, keepdim=True).detach())
    return e / e.sum(1, keepdim=True)


def _layer_norm():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    g, b = te.placeholder((m,), name="gamma"), te.placeholder((m,), name="beta")
    k = te.reduce_axis(m, "k")
    mean = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) / m, name="mean")
    xc = te.compute((n, m), lambda i, j: x[i, j] - mean[i], name="xc")
    var = te.compute((n,), lambda i: te.sum(xc[i, k] * xc[i, k], axis=k) / m, name="var")
    y = te.compute((n, m), lambda i, j: xc[i, j] * te.rsqrt(var[i] + 1e-5) * g[j] + b[j], name="layer_norm")
    return [x, g, b], y


def _layer_norm_torch(x, g, b):
    xc = x - x.mean(1, keepdim=True)
    return xc * torch.rsqrt((xc * xc).mean(1, keepdim=True) + 1e-5) * g + b


def _gelu_chain():
    n = te.var("n")
    x, b = te.placeholder((n,), name="x"), te.placeholder((n,), name="b")
    return [x, b], te.compute(
        (n,),
        lambda i: 0.5 * (x[i] + b[i]) * (1 + te.erf((x[i] + b[i]) * 0.7071067811865476)) * te.sigmoid(x[i]),
        name="gelu_gate",
    )


def _gelu_chain_torch(x, b):
    v = x + b
    return 0.5 * v * (1 + torch.erf(v * 0.7071067811865476)) * torch.sigmoid(x)


def _max_pool():
    n, c, h, w = (te.var(s) for s in "nchw")
    x = te.placeholder((n, c, h, w), name="x")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")
    return [x], te.compute(
        (n, c, (h - 3) // 2 + 1, (w - 3) // 2 + 1),
        lambda b, ch, i, j: te.max(x[b, ch, i * 2 + rh, j * 2 + rw], axis=[rh, rw]),
        name="max_pool",
    )


def _max_pool_torch(x):
    return x.unfold(2, 3, 2).unfold(3, 3, 2).amax((-1, -2))


def _depthwise():
    n, c, h, w = (te.var(s) for s in "nchw")
    x, wt = te.placeholder((n, c, h, w), name="x"), te.placeholder((c, 3, 3), name="wt")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")

    def body(b, ch, i, j):
        hh, ww = i + rh - 1, j + rw - 1
        inside = (hh >= 0) & (hh < h) & (ww >= 0) & (ww < w)
        return te.sum(te.select(inside, x[b, ch, hh, ww], 0.0) * wt[ch, rh, rw], axis=[rh, rw])

    return [x, wt], te.compute((n, c, h, w), body, name="depthwise")


def _depthwise_torch(x, wt):
    return F.conv2d(x, wt[:, None], padding=1, groups=x.shape[1])


CASES = [
    Case("softmax 1024x1024", _softmax, _softmax_torch, lambda x: torch.softmax(x, 1), [(1024, 1024)]),
    Case("layer norm 1024x1024", _layer_norm, _layer_norm_torch,
         lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, 1e-5), [(1024, 1024), (1024,), (1024,)]),
    Case("gelu-gate chain 1M", _gelu_chain, _gelu_chain_torch, None, [(1 << 20,), (1 << 20,)]),
    Case("max pool 3x3/2, 8x32x64x64", _max_pool, _max_pool_torch, lambda x: F.max_pool2d(x, 3, 2),
         [(8, 32, 64, 64)]),
    Case("depthwise 3x3, 8x32x64x64", _depthwise, _depthwise_torch, _depthwise_torch, [(8, 32, 64, 64), (32, 3, 3)]),
]  # fmt: skip


def measure(threads: int = 2, repeats: int = 7, cases: list[Case] | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    out = []
    for case in CASES if cases is None else cases:
        ins, y = case.program()
        mask = (True,) * len(ins)
        # as @tailjit.op builds it: the forward also writes the reductions the backward reads, where
        # that costs it no loop nest
        _, saved = gradient_spec([y], ins, y.name, mask, save_buffered=True)
        kernel = tailjit.build([y, *saved], ins)
        kernel.mark_saved(len(saved))
        grad_kernel = kernel.gradient_kernel(mask)
        gen = torch.Generator().manual_seed(0)
        args = [torch.randn(s, generator=gen) for s in case.shapes]
        leaves = [a.clone().requires_grad_() for a in args]
        with torch.no_grad():
            y_val, *kept = _outputs(kernel(*args))
        head = torch.randn(y_val.shape, generator=gen)
        ours = grad_kernel(*args, y_val, *kept, head)
        ours = ours if isinstance(ours, tuple) else (ours,)
        comp_out = case.composite(*leaves)
        want = torch.autograd.grad(comp_out, leaves, head, retain_graph=True)
        for a, b in zip(ours, want):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        fused_out = case.fused(*leaves) if case.fused is not None else None
        t = interleaved(_variants(kernel, grad_kernel, args, leaves, [y_val, *kept], head, comp_out, case.fused,
                                  fused_out),
                        repeats=repeats, batch_s=0.05)  # fmt: skip
        out.append(
            {
                "case": case.name,
                "backward_kernels": len(grad_kernel.kernels),
                "saved": [t.name for t in saved],
                **{k: v.median for k, v in t.items()},
            }
        )
    return out


def _outputs(res) -> tuple:
    return res if isinstance(res, tuple) else (res,)


def _variants(kernel, grad_kernel, args, leaves, outs, head, comp_out, fused, fused_out) -> dict:
    variants = {
        "tailjit backward": lambda: grad_kernel(*args, *outs, head),
        "torch composite backward": lambda: torch.autograd.grad(comp_out, leaves, head, retain_graph=True),
        "tailjit fw+bw": lambda: torch.autograd.grad(_outputs(kernel(*leaves))[0], leaves, head),
    }
    if fused is not None:
        variants["torch fused backward"] = lambda: torch.autograd.grad(fused_out, leaves, head, retain_graph=True)
        variants["torch fused fw+bw"] = lambda: torch.autograd.grad(fused(*leaves), leaves, head)
    return variants


def report(rows: list[dict], threads: int, console: Console) -> None:
    table = Table(title=f"compiled gradients vs torch autograd ({threads} threads, medians of interleaved runs, ms)")
    for col in ("operator", "bw kernels", "tailjit bw", "torch composite bw", "ratio", "torch fused bw", "ratio",
                "tailjit fw+bw", "torch fused fw+bw", "ratio"):  # fmt: skip
        table.add_column(col, justify="left" if col == "operator" else "right")
    for r in rows:
        ours = r["tailjit backward"]
        comp = r["torch composite backward"]
        fused = r.get("torch fused backward")
        table.add_row(
            r["case"], str(r["backward_kernels"]), f"{ours * 1e3:.2f}", f"{comp * 1e3:.2f}", f"{comp / ours:.2f}x",
            *_against(ours, fused),
            f"{r['tailjit fw+bw'] * 1e3:.2f}", *_against(r["tailjit fw+bw"], r.get("torch fused fw+bw")),
        )  # fmt: skip
    console.print(table)
    console.print("ratio > 1: tailjit is faster")


def _against(ours: float, theirs: float | None) -> tuple[str, str]:
    """A torch time in ms and its ratio to ours, or dashes where torch has no such operator."""
    return (f"{theirs * 1e3:.2f}", f"{theirs / ours:.2f}x") if theirs else ("-", "-")


def main(args) -> int:
    threads = getattr(args, "threads", None) or 2
    rows = measure(threads=threads, repeats=11 if getattr(args, "full", False) else 7)
    report(rows, threads, Console())
    path = getattr(args, "json", None)
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--full", action="store_true")
    p.add_argument("--json")
    raise SystemExit(main(p.parse_args()))
