"""Label-smoothed cross-entropy through ``tailjit.jit`` (the bench's operator, ``large``: 4096 x 4096
logits, 1 thread): its forward and backward kernels called directly, with side outputs on (A: the
forward saves the row maximum and sum, the backward reads them) and off (B: ``fusion._side_index``
patched to refuse every side output while B is built), interleaved; medians in ms.

    python docs/scripts/lsce_backward_ab.py large
"""

import sys

import torch

import tailjit
import tailjit.fusion as fusion
from tailjit.bench.registry import all_operators
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
op = all_operators()["label_smoothing_ce"]
args = op.inputs(sys.argv[1] if len(sys.argv) > 1 else "large", 0)
x = args[0].detach().clone().requires_grad_()
rest = args[1:]
calls = {}
side_index = fusion._side_index
for label in "AB":
    if label == "B":
        fusion._side_index = lambda *a: None
    f = tailjit.jit(lambda *a: op.fn(*a))
    f(x, *rest).backward()
    (fw, _), (bw, _) = f.reports[0].kernels
    with torch.no_grad():
        outs = fw(x.detach(), *rest)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ins, head = [x.detach(), *rest], torch.ones(())
    print(label, "forward outputs", fw.output_names, "backward inputs", bw.input_names)
    calls[f"{label} bw"] = lambda bw=bw, ins=ins, outs=outs, head=head: bw(*ins, *outs, head)
    calls[f"{label} fw"] = lambda fw=fw, ins=ins: fw(*ins)
    fusion._side_index = side_index
r = interleaved(calls, repeats=15)
print({k: round(v.median * 1e3, 3) for k, v in r.items()})
