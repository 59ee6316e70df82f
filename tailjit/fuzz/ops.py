"""The op families a program draws from: each draws operands from the values so far and emits a line.

Templates name their operands ``{x}``, ``{y}``, ...; an entry is ``(template, exact, margin)``: ``exact``
when every entry computes the same bits (IEEE-rounded arithmetic, selections, views; not transcendentals,
whose libraries differ in the last bit, nor reductions, which may reassociate), ``margin`` a function of the
operands giving their relative distance to the op's discontinuities (see ``programs.py``).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from tailjit.fuzz.builder import Builder, literal


def _rel(d, *scale):
    return d.abs() / (1 + sum(s.abs() for s in scale))


def diff(x, y=None):
    y = torch.zeros_like(x) if y is None else y
    x, y = torch.broadcast_tensors(x.double(), torch.as_tensor(y).double())
    return _rel(x - y, x, y)


def to_int(x):
    x = x.double()
    return _rel(x - x.round(), x)


def to_half(x):
    x = x.double()
    return _rel(x - x.floor() - 0.5, x)


def quotient(x, y):
    return to_int(x.double() / torch.as_tensor(y).double())


def ties(x, d=-1):
    """Relative gaps between neighbours in sorted order along ``d`` (near-ties decide indices and max's gradient)."""
    if x.dim() == 0 or x.shape[d] < 2:
        return torch.ones(1)
    v = x.double().sort(d).values
    return _rel(v.narrow(d, 1, v.shape[d] - 1) - v.narrow(d, 0, v.shape[d] - 1), v.narrow(d, 1, v.shape[d] - 1))


def unit_kinks(x):
    return torch.minimum(diff(x, torch.ones(())), diff(x, -torch.ones(())))


UNARY = [
    ("torch.exp({x})", False, None), ("torch.log({x})", False, None), ("torch.sqrt({x})", True, diff),
    ("torch.tanh({x})", False, None), ("torch.sigmoid({x})", False, None), ("torch.sin({x})", False, None),
    ("torch.floor({x})", True, to_int), ("torch.round({x})", True, to_half), ("torch.reciprocal({x})", True, None),
    ("F.gelu({x})", False, None), ("F.softplus({x})", False, None), ("F.elu({x})", False, diff),
    ("F.leaky_relu({x}, 0.1)", True, diff), ("torch.exp2({x})", False, None), ("torch.log2({x})", False, None),
    ("torch.atan({x})", False, None), ("torch.abs({x})", True, diff), ("-{x}", True, None),
    ("torch.sign({x})", True, diff), ("torch.relu({x})", True, diff), ("{x} * 2", True, None),
    ("{x} + 1", True, None), ("{x} - 0.5", True, None), ("{x} * {x}", True, None), ("{x} ** 2", False, None),
    ("{x} / 3", True, None), ("torch.isnan({x})", True, None), ("torch.isinf({x})", True, None),
    ("~{x}", True, None), ("torch.logical_not({x})", True, diff), ("{x}.float()", True, None),
    ("{x}.double()", True, None), ("{x}.bool()", True, diff), ("{x}.clamp(-1, 1)", True, unit_kinks),
    ("{x}.clamp(min=0.5)", True, lambda x: diff(x, torch.full((), 0.5))), ("F.hardtanh({x})", True, unit_kinks),
    ("torch.rsqrt({x})", False, None), ("torch.expm1({x})", False, None), ("torch.log1p({x})", False, None),
    ("torch.erf({x})", False, None), ("torch.nan_to_num({x})", True, None), ("torch.trunc({x})", True, to_int),
]  # fmt: skip

BINARY = [
    ("{x} + {y}", True, None), ("{x} - {y}", True, None), ("{x} * {y}", True, None), ("{x} / {y}", True, None),
    ("torch.maximum({x}, {y})", True, diff), ("torch.minimum({x}, {y})", True, diff),
    ("torch.atan2({x}, {y})", False, None), ("torch.pow({x}, {y})", False, None),
    ("torch.remainder({x}, {y})", True, quotient), ("torch.fmod({x}, {y})", True, quotient),
    ("torch.div({x}, {y}, rounding_mode='floor')", True, quotient),
    ("torch.div({x}, {y}, rounding_mode='trunc')", True, quotient),
    ("{x} < {y}", True, diff), ("{x} <= {y}", True, diff), ("{x} == {y}", True, diff), ("{x} != {y}", True, diff),
    ("{x} > {y}", True, diff), ("torch.logical_and({x}, {y})", True, None), ("torch.logical_or({x}, {y})", True, None),
    ("{x} & {y}", True, None), ("{x} | {y}", True, None), ("{x} ^ {y}", True, None),
    ("torch.hypot({x}, {y})", False, None), ("torch.where({x} > {y}, {x}, {y} * 2)", True, diff),
]  # fmt: skip

#: Templates whose eager result is implementation-defined for some operands (not generated there):
#: float32 ``gelu`` of +-inf is NaN in eager's vectorised kernel and +-inf / -0.0 in its scalar one (a
#: one-element tensor), by size.
UNDEFINED = {"F.gelu({x})": lambda x: x.dtype == torch.float32 and bool(x.isinf().any())}


def defined(template: str, x: torch.Tensor) -> bool:
    return template not in UNDEFINED or not UNDEFINED[template](x)


SCALARS = ["2", "-1", "0.5", "0", "3.0", "float('inf')", "-2.5", "True"]

#: (template, exact, margin, accumulates: its reduction length counts for the tolerance)
REDUCTIONS = [
    ("{x}.sum({d}{k})", False, None, True), ("{x}.mean({d}{k})", False, None, True),
    ("{x}.amax({d}{k})", True, ties, False), ("{x}.max({d}{k}).values", True, ties, False),
    ("{x}.min({d}{k}).indices", True, ties, False), ("{x}.argmax({d}{k})", True, ties, False),
    ("{x}.argmin({d}{k})", True, ties, False), ("torch.logsumexp({x}, {d}{k})", False, None, True),
    ("{x}.prod({d}{k})", False, None, True), ("{x}.var({d}{k})", False, None, True),
    ("{x}.all({d}{k})", True, None, False), ("{x}.any({d}{k})", True, None, False),
    ("{x}.norm(dim={d}{k})", False, None, True), ("torch.softmax({x}, {d})", False, None, True),
    ("torch.log_softmax({x}, {d})", False, None, True), ("torch.cumsum({x}, {d})", False, None, True),
    ("torch.cumprod({x}, {d})", False, None, True), ("torch.cummax({x}, {d}).values", True, ties, False),
    ("torch.cummin({x}, {d}).indices", True, ties, False), ("torch.logcumsumexp({x}, {d})", False, None, True),
    ("{x}.sort({d}).values", True, None, False), ("{x}.std({d}{k})", False, None, True),
]  # fmt: skip

FULL_REDUCTIONS = [("{x}.sum()", False, None), ("{x}.amax()", True, ties), ("{x}.mean()", False, None),
                   ("{x}.argmax()", True, ties), ("{x}.any()", True, None), ("{x}.prod()", False, None)]  # fmt: skip


def _fill(template: str, **names) -> str:
    return template.format(**names)


def _broadcastable(shape):
    def ok(t):
        try:
            torch.broadcast_shapes(shape, t.shape)
            return True
        except RuntimeError:
            return False

    return ok


def unary(b: Builder):
    x = b.pick()
    template, exact, margin = b.choice(UNARY)
    t = b.target()
    if defined(template, b.ns[x]):
        b.emit([f"{t} = {_fill(template, x=x)}"], t, [x], exact, margin)


def binary(b: Builder):
    x = b.pick()
    template, exact, margin = b.choice(BINARY)
    t = b.target()
    if b.chance(3):
        y = b.choice(SCALARS)
        line = f"{t} = {_fill(template, x=x, y=y)}"
        return b.emit([line], t, [x], exact, margin and (lambda v: margin(v, torch.tensor(eval(y)))))
    y = b.pick(_broadcastable(b.ns[x].shape))
    if b.chance(4):  # the other way round: the scalar or broadcast operand first
        x, y = y, x
    b.emit([f"{t} = {_fill(template, x=x, y=y)}"], t, [x, y], exact, margin)


def where(b: Builder):
    x = b.pick()
    t = b.target()
    shape = b.ns[x].shape
    c = b.pick(lambda v: v.dtype == torch.bool and _broadcastable(shape)(v))
    if c is None:
        return b.emit([f"{t} = torch.where({x} > 0, {x}, -{x})"], t, [x], True, diff)
    y = b.pick(_broadcastable(shape))
    form = b.choice(["torch.where({c}, {x}, {y})", "{x}.masked_fill({c}, -1.5)", "torch.where({c}, {x}, 0)",
                     "torch.clamp({x}, min={y})"])  # fmt: skip
    operands = [x, y] if "{y}" in form else [x]
    b.emit([f"{t} = {_fill(form, c=c, x=x, y=y)}"], t, [c, *operands], True, None)


def _dim(b: Builder, x: str) -> int | None:
    n = b.ns[x].dim()
    return b.integer(-n, n - 1) if n else None


def reduction(b: Builder):
    x = b.pick()
    t = b.target()
    d = _dim(b, x)
    if d is None or b.chance(5):
        template, exact, margin = b.choice(FULL_REDUCTIONS)
        m = margin and (lambda v: margin(v.reshape(-1)))
        return b.emit([f"{t} = {_fill(template, x=x)}"], t, [x], exact, m, max(1, b.ns[x].numel()))
    template, exact, margin, accumulates = b.choice(REDUCTIONS)
    k = ", keepdim=True" if b.chance(3) else ""
    m = margin and (lambda v: margin(v, d))
    length = b.ns[x].shape[d] if accumulates else 1
    b.emit([f"{t} = {_fill(template, x=x, d=d, k=k)}"], t, [x], exact, m, length)


def _reshape_target(b: Builder, shape) -> list[int]:
    shape = list(shape)
    kind = b.choice(["flat", "merge", "split", "one"])
    if kind == "flat" or len(shape) < 2 and kind == "merge":
        return [-1]
    if kind == "merge":
        i = b.integer(0, len(shape) - 2)
        return shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2 :]
    if kind == "split" and shape:
        i = b.integer(0, len(shape) - 1)
        f = 2 if shape[i] % 2 == 0 and shape[i] > 0 else 1
        return shape[:i] + [f, -1 if shape[i] else 0] + shape[i + 1 :]
    i = b.integer(0, len(shape))
    return shape[:i] + [1] + shape[i:]


def _slices(b: Builder, shape) -> str:
    parts = []
    for _ in range(b.integer(1, max(1, len(shape)))):
        parts.append(b.choice([":", "1:", ":-1", "::2", "1::2", "-2:", ":0", "0", "-1", "None", "..."]))
    return ", ".join(parts)


def view(b: Builder):
    x = b.pick()
    t = b.target()
    v = b.ns[x]
    n = v.dim()
    d = _dim(b, x) if n else 0
    size = v.shape[d] if n else 1
    perm = b.draw(st.permutations(range(n)))
    forms = [
        f"{x}.t()", f"{x}.transpose(0, {d})", f"{x}.permute({literal(perm)})",
        f"{x}.reshape({literal(_reshape_target(b, v.shape))})", f"{x}.view({literal(_reshape_target(b, v.shape))})",
        f"{x}.unsqueeze({d})", f"{x}.squeeze({d})", f"{x}.flip({d})", f"{x}[{_slices(b, v.shape)}]",
        f"{x}.narrow({d}, {b.integer(0, 2)}, {b.integer(0, 2)})", f"{x}.select({d}, {b.integer(-2, 2)})",
        f"{x}.unsqueeze(0).expand({literal([b.choice([2, 3, 0])] + list(v.shape))})",
        f"{x}.expand({literal([b.choice([2, 3]) if s == 1 else s for s in v.shape])})",
        f"torch.cat([{x}, {x}.flip({d})], {d})", f"torch.stack([{x}, {x} * 2], {d})",
        f"{x}.repeat({literal([b.integer(1, 2) for _ in range(n + b.integer(0, 1))])})",
        f"F.pad({x}, ({b.integer(-1, 2)}, {b.integer(0, 2)}))", f"{x}.diagonal()", f"{x}.roll({b.integer(-3, 3)}, {d})",
        f"{x}.unfold({d}, {b.integer(1, 3)}, {b.integer(1, 2)})", f"{x}.contiguous()", f"{x}.clone()",
        f"{x}.split({b.integer(1, 3)}, {d})[{b.integer(-1, 1)}]", f"{x}.chunk(2, {d})[0]", f"{x}.movedim(0, -1)",
        f"{x}.tile((2,))", f"{x}[{b.integer(-size - 1, size)}]",
    ]  # fmt: skip
    if b.chance(3):
        y = b.pick(lambda u: u.dim() == n and n > 0 and all(p == q for i, (p, q) in enumerate(zip(u.shape, v.shape))
                                                             if i != d % n))  # fmt: skip
        forms = [f"torch.cat([{x}, {y}], {d})"] if y else forms
        operands = [x, y] if y else [x]
    else:
        operands = [x]
    b.emit([f"{t} = {b.choice(forms)}"], t, operands)


def _index(b: Builder, high: int, shape, unique_dim=None) -> str:
    """A new integer parameter of ``shape`` with values in [0, high) (now and then out of range: eager raises
    and every entry must), unique along ``unique_dim`` when given (a random permutation's prefix)."""
    if unique_dim is not None:
        full = list(shape)
        k = full[unique_dim]
        full[unique_dim] = high
        s = b.next_seed()
        return b.param(b.make(f"torch.rand({literal(full)}, generator=gen({s})).argsort({unique_dim})"
                              f".narrow({unique_dim}, 0, {k})"))  # fmt: skip
    if b.chance(20):
        return b.param(b.make(b.data(shape, torch.int64, low=-high - 1, high=high + 2)))
    return b.param(b.make(b.data(shape, torch.int64, low=-high if b.chance(4) else 0, high=max(high, 1))))


def _along(b: Builder):
    """A value of at least one dimension, a target name, and a dimension of it with its size; or None."""
    x = b.pick(lambda v: v.dim() >= 1)
    if x is None:
        return None
    d = _dim(b, x)
    return x, b.target(), b.ns[x], d, b.ns[x].shape[d]


def indexing(b: Builder):
    found = _along(b)
    if found is None:
        return
    x, t, v, d, size = found
    k = b.integer(0, 4)
    kind = b.choice(["gather", "argmax", "index_select", "adv", "adv1", "mask", "embedding"])
    if kind == "gather":
        shape = list(v.shape)
        shape[d] = k
        i = _index(b, size, shape)
        return b.emit([f"{t} = torch.gather({x}, {d}, {i})"], t, [x, i])
    if kind == "argmax":
        y = b.pick(lambda u: u.shape == v.shape)
        line = f"{t} = torch.gather({x}, {d}, {y}.argmax({d}, keepdim=True))"
        return b.emit([line], t, [x, y], True, lambda a, c: ties(c, d))
    if kind == "index_select":
        i = _index(b, size, [k])
        return b.emit([f"{t} = {x}.index_select({d}, {i})"], t, [x, i])
    if kind in ("adv", "adv1"):
        dim = 0 if kind == "adv" or v.dim() < 2 else 1
        i = _index(b, v.shape[dim], [b.integer(0, 3) for _ in range(b.integer(1, 2))])
        return b.emit([f"{t} = {x}[{':, ' * dim}{i}]"], t, [x, i])
    if kind == "embedding":
        i = _index(b, v.shape[0], [k])
        return b.emit([f"{t} = F.embedding({i}, {x})"], t, [x, i])
    m = b.pick(lambda u: u.dtype == torch.bool and u.shape == v.shape)
    if m is None:
        return b.emit([f"{t} = {x}[{x} > 0]"], t, [x], True, diff)
    b.emit([f"{t} = {x}[{m}]"], t, [x, m])


def scatter(b: Builder):
    found = _along(b)
    if found is None:
        return
    x, t, v, d, size = found
    k = b.integer(0, min(4, size) if b.chance(2) else 4)
    shape = list(v.shape)
    shape[d] = k
    src = b.param(b.make(b.data(shape, v.dtype)))
    kind = b.choice(["scatter_add", "index_add", "index_put_acc", "scatter", "scatter_value", "index_copy",
                     "index_put", "scatter_reduce"])  # fmt: skip
    exact = not v.dtype.is_floating_point
    if kind == "scatter_add":
        i = _index(b, size, shape)
        return b.emit([f"{t} = {x}.scatter_add({d}, {i}, {src})"], t, [x, i, src], exact, None, k + 1)
    if kind == "index_add":
        i = _index(b, size, [k])
        return b.emit([f"{t} = {x}.index_add({d}, {i}, {src})"], t, [x, i, src], exact, None, k + 1)
    if kind == "scatter_reduce":
        i = _index(b, size, shape)
        how = b.choice(["sum", "prod", "mean", "amax", "amin"])
        inc = b.choice(["True", "False"])
        line = f"{t} = {x}.scatter_reduce({d}, {i}, {src}, '{how}', include_self={inc})"
        return b.emit([line], t, [x, i, src], exact or how in ("amax", "amin"), None, k + 1)
    if k > size:
        return
    if kind in ("scatter", "scatter_value"):
        i = _index(b, size, shape, unique_dim=d)
        value = src if kind == "scatter" else "0.5"
        return b.emit([f"{t} = {x}.scatter({d}, {i}, {value})"], t, [x, i, src])
    if kind == "index_copy":
        i = b.param(b.make(f"torch.randperm({size}, generator=gen({b.next_seed()}))[:{k}]"))
        return b.emit([f"{t} = {x}.index_copy({d}, {i}, {src})"], t, [x, i, src])
    i = b.param(b.make(f"torch.randperm({v.shape[0]}, generator=gen({b.next_seed()}))[:{k}]"))
    acc = kind == "index_put_acc"
    if acc:
        i = _index(b, v.shape[0], [k])
    src = b.param(b.make(b.data([k] + list(v.shape[1:]), v.dtype)))
    line = f"{t} = {x}.index_put(({i},), {src}{', accumulate=True' if acc else ''})"
    b.emit([line], t, [x, i, src], exact or not acc, None, k + 1 if acc else 1)


def inplace(b: Builder):
    """``y = x.clone()`` then an in-place update of ``y`` (or, now and then, of an input itself)."""
    mutate_input = b.chance(4)
    x = b.pick(lambda v: v.dim() >= 1) if not mutate_input else b.choice([f"p{i}" for i in range(len(b.p.args))])
    if x is None:
        return
    v = b.ns[x]
    t = b.target()
    e = None if b.chance(2) else b.pick(lambda u: u.dim() <= v.dim())
    e = e or b.choice(SCALARS[:5])
    operands = [x] + ([e] if e in b.exact else [])
    if mutate_input:
        lines, y = [f"{t} = {x}"], t
    else:
        lines, y = [f"{t} = {x}.clone()"], t
    form = b.choice(["{y}[{s}] += {e}", "{y}[{s}] = {e}", "{y}[{s}] *= {e}", "{y}.add_({e})", "{y}.mul_({e})",
                     "{y}.clamp_(min=0)", "{y}[{y} > 0] = 0", "{y}.masked_fill_({y} < 0, 1)", "{y}.sub_({e})",
                     "{y}.exp_()", "{y}.copy_({e})"])  # fmt: skip
    lines.append(_fill(form, y=y, s=_slices(b, v.shape), e=e))
    exact = form != "{y}.exp_()"
    margin = diff if "> 0" in form or "< 0" in form or "clamp" in form else None
    b.emit(lines, t, operands, exact, margin and (lambda a, *rest: diff(a)), mutates=mutate_input)


def control(b: Builder):
    """A Python ``if`` on a size or on a value."""
    x = b.pick()
    t = b.target()
    then, _, _ = b.choice(UNARY)
    other, _, _ = b.choice(UNARY)
    if not (defined(then, b.ns[x]) and defined(other, b.ns[x])):
        return
    kind = b.choice(["shape", "numel", "sum", "any"])
    v = b.ns[x]
    if kind == "shape" and v.dim():
        cond, margin = f"{x}.shape[{_dim(b, x)}] > {b.integer(0, 3)}", None
    elif kind == "sum":
        cond, margin = f"{x}.sum() > 0", lambda a: _rel(a.double().sum(), a.double().abs().sum())
        margin_always = v.dtype.is_floating_point
        if margin_always and not bool(margin(v) > 1e-3):
            return
    elif kind == "any":
        cond, margin = f"({x} > 1).any()", lambda a: diff(a, torch.ones(()))
    else:
        cond, margin = f"{x}.numel() == 0", None
    lines = [f"if {cond}:\n    {t} = {_fill(then, x=x)}\nelse:\n    {t} = {_fill(other, x=x)}"]
    b.emit(lines, t, [x], False, margin)


def matmul(b: Builder):
    x = b.pick(lambda v: v.dim() == 2 and v.dtype.is_floating_point)
    if x is None:
        return
    t = b.target()
    y = b.pick(lambda u: u.dim() in (1, 2) and u.dtype == b.ns[x].dtype and u.shape[0] == b.ns[x].shape[1])
    if y is None:
        return b.emit([f"{t} = {x} @ {x}.t()"], t, [x], False, None, b.ns[x].shape[1])
    b.emit([f"{t} = {x} @ {y}"], t, [x, y], False, None, b.ns[x].shape[1])


FAMILIES = [unary, unary, binary, binary, binary, where, reduction, reduction, view, view, indexing, scatter,
            inplace, control, matmul]  # fmt: skip
