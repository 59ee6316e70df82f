"""subLSTM's cell (batch 32, hidden 128) as the networks suite runs it: eager PyTorch against the
``@tailjit.op`` called on the (B, 4, H) view of the gate pre-activations, interleaved in one process (1 thread),
medians in us: no grad, forward with grad, forward and backward.

    python docs/scripts/rnn_cell_time.py
"""

import torch

from tailjit.bench import networks as N
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
pre = torch.randn(32, 512, requires_grad=True)
c0 = torch.randn(32, 128, requires_grad=True)


def eager_cell():
    z, i, f, o = torch.sigmoid(pre).chunk(4, dim=1)
    c = c0 * f + z - i
    return torch.sigmoid(c) - o, c


def tailjit_cell():
    return N.sublstm_cell(pre.view(-1, 4, 128), c0)


def no_grad(cell):
    with torch.no_grad():
        cell()


def fwbw(cell):
    h, c = cell()
    torch.autograd.backward([h, c], [torch.ones_like(h), torch.ones_like(c)])


calls = {}
for label, cell in (("eager", eager_cell), ("tailjit", tailjit_cell)):
    calls[f"{label} fw (no grad)"] = lambda cell=cell: no_grad(cell)
    calls[f"{label} fw"] = cell
    calls[f"{label} fw+bw"] = lambda cell=cell: fwbw(cell)
r = interleaved(calls, repeats=31)
for k, v in r.items():
    print(f"{k:22s} {v.median * 1e6:8.1f}")
