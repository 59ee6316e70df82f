"""A catalogue of operators written as tensor expressions, each with the
equivalent torch function, for the gradient tests (``test_autodiff*.py``).

``Op.program(dtype)`` returns ``(placeholders, output)``; ``Op.torch`` takes
the same tensors; ``Op.example(dtype, gen)`` draws inputs (the float ones are
differentiated).  Static hyper-parameters (strides, padding, windows) are
Python values baked into the expressions, sizes are symbolic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tailjit import te


@dataclass
class Op:
    name: str
    program: Callable  # dtype -> (placeholders, output compute)
    torch: Callable  # (*tensors) -> tensor
    example: Callable  # (dtype, torch.Generator) -> list of tensors


def matmul_program(dtype):
    n, k, m = te.var("n"), te.var("k"), te.var("m")
    a, b = te.placeholder((n, k), dtype, "a"), te.placeholder((k, m), dtype, "b")
    r = te.reduce_axis(k, "r")
    return [a, b], te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")


def conv2d_program(dtype, stride: int, pad: int):
    """NCHW convolution with an OIHW weight, zero padding ``pad`` and stride ``stride``."""
    n, c, h, w = (te.var(s) for s in ("n", "c", "h", "w"))
    o, kh, kw = te.var("o"), te.var("kh"), te.var("kw")
    x = te.placeholder((n, c, h, w), dtype, "x")
    wt = te.placeholder((o, c, kh, kw), dtype, "wt")
    ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    rc, rh, rw = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw")

    def body(b, oc, i, j):
        hh, ww = i * stride + rh - pad, j * stride + rw - pad
        inside = (hh >= 0) & (hh < h) & (ww >= 0) & (ww < w)
        return te.sum(te.select(inside, x[b, rc, hh, ww], 0.0) * wt[oc, rc, rh, rw], axis=[rc, rh, rw])

    return [x, wt], te.compute((n, o, ho, wo), body, name="conv2d")


def depthwise_program(dtype):
    n, c, h, w, kh, kw = (te.var(s) for s in ("n", "c", "h", "w", "kh", "kw"))
    x = te.placeholder((n, c, h, w), dtype, "x")
    wt = te.placeholder((c, kh, kw), dtype, "wt")
    rh, rw = te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw")
    return [x, wt], te.compute(
        (n, c, h - kh + 1, w - kw + 1),
        lambda b, ch, i, j: te.sum(x[b, ch, i + rh, j + rw] * wt[ch, rh, rw], axis=[rh, rw]),
        name="depthwise",
    )


SHIFTS = [(dh, dw) for dh in (-1, 0, 1) for dw in (-1, 0, 1)]


def shift_conv_program(dtype):
    """Shift (Wu et al.): channel c moves by SHIFTS[c % 9] with zero fill, then a 1x1 convolution."""
    n, c, h, w, o = (te.var(s) for s in ("n", "c", "h", "w", "o"))
    x = te.placeholder((n, c, h, w), dtype, "x")
    wt = te.placeholder((o, c), dtype, "wt")

    def shifted(b, ch, i, j):
        out = te.cast(0.0, dtype)
        for g, (dh, dw) in enumerate(SHIFTS):
            hi, wj = i + dh, j + dw
            ok = (ch % 9 == g) & (hi >= 0) & (hi < h) & (wj >= 0) & (wj < w)
            out = te.select(ok, x[b, ch, hi, wj], out)
        return out

    s = te.compute((n, c, h, w), shifted, name="shifted")
    rc = te.reduce_axis(c, "rc")
    return [x, wt], te.compute(
        (n, o, h, w), lambda b, oc, i, j: te.sum(s[b, rc, i, j] * wt[oc, rc], axis=rc), name="shift_conv"
    )


def shift_conv_torch(x, wt):
    parts = []
    for ch in range(x.shape[1]):
        dh, dw = SHIFTS[ch % 9]
        xc = F.pad(x[:, ch], (1, 1, 1, 1))
        h, w = x.shape[2], x.shape[3]
        parts.append(xc[:, 1 + dh : 1 + dh + h, 1 + dw : 1 + dw + w])
    return torch.einsum("nchw,oc->nohw", torch.stack(parts, 1), wt)


def pool_program(dtype, kind: str, k: int, stride: int):
    n, c, h, w = (te.var(s) for s in ("n", "c", "h", "w"))
    x = te.placeholder((n, c, h, w), dtype, "x")
    rh, rw = te.reduce_axis(k, "rh"), te.reduce_axis(k, "rw")
    shape = (n, c, (h - k) // stride + 1, (w - k) // stride + 1)

    def body(b, ch, i, j):
        v = x[b, ch, i * stride + rh, j * stride + rw]
        if kind == "max":
            return te.max(v, axis=[rh, rw])
        return te.sum(v, axis=[rh, rw]) / (k * k)

    return [x], te.compute(shape, body, name=f"{kind}_pool")


def softmax_program(dtype):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), dtype, "x")
    k = te.reduce_axis(m, "k")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    return [x], te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")


def layer_norm_program(dtype, eps: float = 1e-5):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), dtype, "x")
    g, b = te.placeholder((m,), dtype, "gamma"), te.placeholder((m,), dtype, "beta")
    k = te.reduce_axis(m, "k")
    mean = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) / m, name="mean")
    xc = te.compute((n, m), lambda i, j: x[i, j] - mean[i], name="xc")
    var = te.compute((n,), lambda i: te.sum(xc[i, k] * xc[i, k], axis=k) / m, name="var")
    return [x, g, b], te.compute(
        (n, m), lambda i, j: xc[i, j] * te.rsqrt(var[i] + eps) * g[j] + b[j], name="layer_norm"
    )


def embedding_program(dtype):
    v, d, n = te.var("v"), te.var("d"), te.var("n")
    table = te.placeholder((v, d), dtype, "table")
    idx = te.placeholder((n,), "int64", "idx")
    return [table, idx], te.compute((n, d), lambda i, j: table[idx[i], j], name="embedding")


def _randn(gen, dtype, *shape):
    return torch.randn(*shape, generator=gen, dtype=dtype)


CATALOGUE = [
    Op("matmul", matmul_program, torch.matmul, lambda dt, g: [_randn(g, dt, 3, 4), _randn(g, dt, 4, 5)]),
    Op(
        "conv2d_s2_p1",
        lambda dt: conv2d_program(dt, 2, 1),
        lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        lambda dt, g: [_randn(g, dt, 2, 3, 7, 6), _randn(g, dt, 4, 3, 3, 2)],
    ),
    Op(
        "conv2d_s1_p0",
        lambda dt: conv2d_program(dt, 1, 0),
        lambda x, w: F.conv2d(x, w),
        lambda dt, g: [_randn(g, dt, 1, 2, 5, 5), _randn(g, dt, 3, 2, 3, 3)],
    ),
    Op(
        "depthwise",
        depthwise_program,
        lambda x, w: F.conv2d(x, w[:, None], groups=x.shape[1]),
        lambda dt, g: [_randn(g, dt, 2, 3, 5, 6), _randn(g, dt, 3, 2, 3)],
    ),
    Op(
        "shift_conv",
        shift_conv_program,
        shift_conv_torch,
        lambda dt, g: [_randn(g, dt, 1, 10, 4, 5), _randn(g, dt, 3, 10)],
    ),
    Op(
        "max_pool_k3_s2",
        lambda dt: pool_program(dt, "max", 3, 2),
        lambda x: F.max_pool2d(x, 3, 2),
        lambda dt, g: [_randn(g, dt, 2, 2, 7, 8)],
    ),
    Op(
        "max_pool_k2_s2",
        lambda dt: pool_program(dt, "max", 2, 2),
        lambda x: F.max_pool2d(x, 2, 2),
        lambda dt, g: [_randn(g, dt, 1, 2, 6, 6)],
    ),
    Op(
        "avg_pool_k3_s2",
        lambda dt: pool_program(dt, "avg", 3, 2),
        lambda x: F.avg_pool2d(x, 3, 2),
        lambda dt, g: [_randn(g, dt, 2, 2, 7, 8)],
    ),
    Op("softmax", softmax_program, lambda x: torch.softmax(x, 1), lambda dt, g: [_randn(g, dt, 4, 7)]),
    Op(
        "layer_norm",
        layer_norm_program,
        lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, 1e-5),
        lambda dt, g: [_randn(g, dt, 3, 8), _randn(g, dt, 8), _randn(g, dt, 8)],
    ),
]

#: Operators whose gradient is a te.scatter (data-dependent indices).
SCATTER_CATALOGUE = [
    Op(
        "embedding",
        embedding_program,
        lambda table, idx: F.embedding(idx, table),
        lambda dt, g: [_randn(g, dt, 6, 3), torch.tensor([0, 2, 2, 5, 0, 2, 1])],
    ),
]
