"""A program being drawn (:class:`Builder`) and the drawn one (:class:`DrawnProgram`): input records and body lines."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from tailjit.fuzz import values

#: How far (relative) an inexact float must be from a discontinuity for a discontinuous op to read it.
MARGIN = 1e-3

HEADER = '''"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle
'''

DTYPES = [torch.float32, torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]
SIZES = [2, 3, 1, 4, 5, 3, 2, 0]


@dataclass
class DrawnProgram:
    inputs: list = field(default_factory=list)  # (name, expression) lines of make_inputs
    args: list = field(default_factory=list)  # the expressions make_inputs returns, one per parameter of fn
    body: list = field(default_factory=list)  # fn's lines (a line may hold an indented block)
    outputs: list = field(default_factory=list)
    reduce_len: int = 1  # the longest reduction (or accumulation) in the program
    magnitude: float = 1.0  # the largest finite magnitude of an inexact float value
    mutates: bool = False  # whether fn writes into its inputs (then gradients are not checked)
    raises: bool = False  # whether eager raises (at the last body line)

    def source(self) -> str:
        lines = [HEADER, "", "def make_inputs():"]
        lines += [f"    {name} = {expr}" for name, expr in self.inputs]
        lines.append(f"    return [{', '.join(self.args)}]")
        lines += ["", "", f"def fn({', '.join(f'p{i}' for i in range(len(self.args)))}):"]
        for line in self.body:
            lines += ["    " + part for part in line.split("\n")]
        lines.append(f"    return {literal(self.outputs)}")
        tol = f"dict(reduce_len={self.reduce_len}, magnitude={self.magnitude!r}, mutates={self.mutates})"
        lines += ["", "", f"TOLERANCE = {tol}", "", ""]
        lines += ['if __name__ == "__main__":', "    from tailjit.fuzz.check import main", ""]
        lines.append("    main(fn, make_inputs, TOLERANCE)")
        return "\n".join(lines) + "\n"


def far(distance: torch.Tensor) -> bool:
    """Whether every defined element of a relative ``distance`` to a discontinuity exceeds :data:`MARGIN`."""
    d = distance[~torch.isnan(distance)]
    return d.numel() == 0 or bool((d > MARGIN).all())


def literal(shape) -> str:
    """A tuple's source: ``(2, 3)``, ``(4,)``, ``()``."""
    items = [str(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class Builder:
    """A program being drawn: its records, fn's namespace as eager left it, and what is known of each value."""

    def __init__(self, draw, seed: int):
        self.draw, self.seed = draw, seed
        self.p = DrawnProgram()
        self.make_ns = {"torch": torch, "gen": values.gen, "sprinkle": values.sprinkle}
        self.ns = {"torch": torch, "F": F}
        self.exact: dict[str, bool] = {}  # value name -> computed the same bits in every entry
        self.temps: list[str] = []

    # --- drawing --------------------------------------------------------------------------------------
    def choice(self, options):
        return self.draw(st.sampled_from(list(options)))

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def chance(self, one_in: int) -> bool:
        return self.draw(st.integers(0, one_in - 1)) == 0

    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def names(self, pred=lambda t: True) -> list[str]:
        return [n for n in self.exact if isinstance(self.ns.get(n), torch.Tensor) and pred(self.ns[n])]

    def pick(self, pred=lambda t: True):
        """A value (name) satisfying ``pred``, or None; the latest one half of the time, for deeper chains."""
        found = self.names(pred)
        if found and found[-1] in self.temps and self.chance(2):
            return found[-1]
        return self.choice(found) if found else None

    # --- inputs ---------------------------------------------------------------------------------------
    def data(self, shape, dtype, specials=False, low=-5, high=6) -> str:
        """The expression of a fresh tensor of random data."""
        s, shp = self.next_seed(), literal(shape)
        name = str(dtype).removeprefix("torch.")
        if dtype.is_floating_point:
            e = f"torch.randn({shp}, generator=gen({s}), dtype=torch.{name})"
            return f"sprinkle({e}, {s})" if specials else e
        if dtype == torch.bool:
            return f"torch.rand({shp}, generator=gen({s})) < 0.5"
        return f"torch.randint({low}, {high}, {shp}, generator=gen({s}), dtype=torch.{name})"

    def make(self, expr: str) -> str:
        """A make_inputs variable holding ``expr``."""
        name = f"a{len(self.p.inputs)}"
        exec(f"{name} = {expr}", self.make_ns)
        self.p.inputs.append((name, expr))
        return name

    def param(self, arg_expr: str) -> str:
        """A new parameter of fn, passed ``arg_expr`` (evaluated in make_inputs)."""
        name = f"p{len(self.p.args)}"
        self.ns[name] = eval(arg_expr, self.make_ns)
        self.p.args.append(arg_expr)
        self.exact[name] = True
        return name

    def input_tensor(self) -> str:
        """A parameter with a random shape, dtype, layout and (for floats, sometimes) special values."""
        ndim = self.choice([2, 1, 3, 0])
        shape = [self.choice(SIZES) for _ in range(ndim)]
        dtype = self.choice(DTYPES)
        specials = dtype.is_floating_point and self.chance(4)
        layout = self.choice(["contiguous", "transposed", "stepped", "expanded"][: 1 + min(ndim, 1) * 3])
        if layout == "transposed" and ndim >= 2:
            base = shape[:-2] + [shape[-1], shape[-2]]
            return self.param(self.make(self.data(base, dtype, specials)) + ".transpose(-1, -2)")
        if layout == "stepped":
            return self.param(self.make(self.data(shape[:-1] + [2 * shape[-1]], dtype, specials)) + "[..., ::2]")
        if layout == "expanded":
            return self.param(f"{self.make(self.data([1] + shape[1:], dtype, specials))}.expand({literal(shape)})")
        return self.param(self.make(self.data(shape, dtype, specials)))

    def aliased_inputs(self):
        """The same tensor passed twice, or two overlapping views of one base."""
        if self.chance(2):
            self.param(self.p.args[self.integer(0, len(self.p.args) - 1)])
            return
        shape = [self.choice(SIZES[:5]) for _ in range(self.choice([1, 2]))]
        base = self.make(self.data(shape[:-1] + [shape[-1] + 1], self.choice(DTYPES[:3])))
        self.param(f"{base}[..., 1:]")
        self.param(f"{base}[..., :-1]")

    # --- body -----------------------------------------------------------------------------------------
    def emit(self, lines, target, operands, exact=True, margin=None, reduce_len=1, mutates=False) -> bool:
        """Run ``lines`` (binding ``target``) eagerly and keep them if eager accepts them; ``margin(*operand
        values)`` is the relative distance of the operands to the op's discontinuities."""
        inexact = any(not self.exact[o] and self.ns[o].dtype.is_floating_point for o in operands)
        if margin is not None and inexact:
            try:
                if not far(margin(*(self.ns[o] for o in operands)).double()):
                    return False
            except RuntimeError:
                pass  # the op itself will raise
        code = "\n".join(lines)
        try:
            exec(code, self.ns)
        except Exception:
            self.ns.pop(target, None)
            if self.chance(8):  # kept: the program ends here, and every entry must raise as eager does
                self.p.body += lines
                self.p.raises = True
                self.p.outputs = [target]  # returned, so that no entry may drop the line as dead code
            return False
        value = self.ns.get(target)
        if not isinstance(value, torch.Tensor):
            self.ns.pop(target, None)
            return False
        self.p.body += lines
        self.exact[target] = exact and not inexact
        if not self.exact[target]:
            self.p.magnitude = max(self.p.magnitude, values.maxabs(value))
        self.p.reduce_len = max(self.p.reduce_len, reduce_len)
        self.p.mutates |= mutates
        if target not in self.temps:
            self.temps.append(target)
        return True

    def target(self) -> str:
        return f"t{len(self.temps)}"
