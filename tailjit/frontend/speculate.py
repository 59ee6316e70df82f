"""Speculative traces: Python control flow on values read from data, traced for the values one call read.

A function that branches on a tensor's value (``if count > 0``, ``int(t)``, ``t.tolist()``) cannot be
traced with fake tensors.  :func:`record` runs it once eagerly, on copies of the inputs, and keeps each
value it reads (``aten._local_scalar_dense``, which ``.item()``, ``bool()``, ``int()`` and ``float()`` all
call; ``tolist()`` is answered element by element through it).  The fake trace then runs under
:class:`Replay`, which answers each read with the recorded value, so Python takes the same branches, and
turns each read into a guard: the graph also computes ``t == value`` for every read tensor, and one more
output says whether all of them held.  A call whose guard fails ran the wrong path: ``tailjit.jit`` drops
its outputs and runs it again another way (:class:`Missed`).

Speculation is refused (:class:`Unspeculable`) where a wrong path could do harm before its guard is
read, or where no guard could see the difference: ops whose output shape depends on data, random ops,
data leaving through ``numpy()`` or ``data_ptr()``, writes into the inputs (a rerun would repeat them),
and more than ``MAX_GUARDS`` reads (each adds a guard, and an unrolled loop of them a large graph).
"""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_READ = _aten._local_scalar_dense.default

#: Reads one speculative trace may guard on (``keypoint_argmax_decode`` reads 68 at its small size).
MAX_GUARDS = 128

#: Paths (sets of read values) kept per signature and sizes before the function takes the torch.compile
#: path: a function whose reads differ at most calls (an NMS loop's iteration count) gains nothing here.
MAX_PATHS = 4


class Unspeculable(RuntimeError):
    """The function cannot be traced speculatively; the message says why."""


class Missed(Exception):
    """A speculative entry's guard failed: the call took another path than the trace."""

    def __init__(self, call):
        super().__init__("a value read from data differs from the speculative trace's")
        self.call = call


def record(flat_function, tensors) -> list:
    """The values ``flat_function(mode)(*tensors)`` reads from data, from one eager run on copies of
    ``tensors`` with the random number generator's state restored after it."""
    copies = [_copy(t) for t in tensors]
    versions = [c._version for c in copies]
    recording = Recording()
    with torch.random.fork_rng(devices=[]):
        flat_function(lambda: recording)(*copies)
    if any(c._version != v for c, v in zip(copies, versions)):
        raise Unspeculable("it writes into its inputs, which a rerun after a failed guard would repeat")
    if not recording.values:
        raise Unspeculable("it reads no values from data")
    return recording.values


def _copy(t: torch.Tensor) -> torch.Tensor:
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t.detach())
    return copy.requires_grad_(t.requires_grad)


class Recording(TorchDispatchMode):
    """Below the function and above the tracer: keeps the values the function reads from data
    (:class:`Replay` answers them instead) and refuses what speculation cannot guard."""

    replay: list | None = None

    def __init__(self):
        super().__init__()
        self.values: list = []
        self.holds: list = []  # per read, a 0-d bool tensor: the read tensor still has the recorded value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _READ:
            if len(self.values) == MAX_GUARDS:
                raise Unspeculable(f"it reads more than {MAX_GUARDS} values from data")
            if self.replay is None:
                value = func(*args, **kwargs)
            elif len(self.values) < len(self.replay):
                value = self.replay[len(self.values)]
                self.holds.append(_holds(args[0], value))
            else:
                raise Unspeculable("its trace read more values than its eager run (it is not deterministic)")
            self.values.append(value)
            return value
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise Unspeculable(f"it calls {func}, a random op")
        return func(*args, **kwargs)


class Replay(Recording):
    """The trace's mode: reads answered with ``values``, in order, each guarded."""

    def __init__(self, values: list):
        super().__init__()
        self.replay = values

    def guard(self) -> torch.Tensor:
        """One 0-d bool tensor: every read of the trace saw its recorded value."""
        if len(self.values) != len(self.replay):
            raise Unspeculable("its trace read fewer values than its eager run (it is not deterministic)")
        return torch.stack(self.holds).all()


def _holds(t: torch.Tensor, value) -> torch.Tensor:
    t = t.reshape(())
    if isinstance(value, float) and math.isnan(value):
        return t != t
    return t == value


class TracedMethods(TorchFunctionMode):
    """For every trace: the tensor methods a trace cannot follow as they are.  ``tolist()`` becomes
    reads (data-dependent for a fake trace, recorded or replayed for a speculative one); the methods
    that hand out data without an op are refused, where a fake tensor would hand out made-up values;
    augmented bitwise assignments (``m &= k``) become their in-place ops, as functionalisation rejects
    ``aten.__iand__``'s schema."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            return _tolist(args[0])
        if func in _ESCAPES:
            raise Unspeculable(f"it reads tensor data through {func.__name__}(), which no trace or guard can follow")
        return _IN_PLACE.get(func, func)(*args, **(kwargs or {}))


_ESCAPES = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.data_ptr, torch.Tensor.untyped_storage,
            torch.Tensor.storage, torch.Tensor.__dlpack__}  # fmt: skip
_IN_PLACE = {
    torch.Tensor.__iand__: torch.Tensor.bitwise_and_,
    torch.Tensor.__ior__: torch.Tensor.bitwise_or_,
    torch.Tensor.__ixor__: torch.Tensor.bitwise_xor_,
}


def _tolist(t: torch.Tensor):
    if t.dim() == 0:
        return t.item()
    return [_tolist(row) for row in t.unbind(0)]
