"""Two extern-call costs behind this session's host-code and view changes, interleaved in one process
(1 thread), medians in us: segment_max's scatter_reduce with its expanded (stride-0) index against the same
index copied, and aten.full called as the traced overload against torch.full.

    python docs/scripts/extern_call_costs.py
"""

import torch

from tailjit.bench.registry import all_operators
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
data, ids = all_operators()["segment_max"].inputs("small", 0)
index = ids.unsqueeze(1).expand_as(data)
copied = index.contiguous()
out = data.new_zeros(100, data.shape[1])
cpu = torch.device("cpu")
full = torch.ops.aten.full.default
r = interleaved({
    "scatter_reduce, expanded index": lambda: out.scatter_reduce(0, index, data, reduce="amax", include_self=False),
    "scatter_reduce, copied index": lambda: out.scatter_reduce(0, copied, data, reduce="amax", include_self=False),
    "aten.full, traced kwargs": lambda: full([100, 32], 0, dtype=torch.float32, layout=torch.strided, device=cpu,
                                             pin_memory=False),
    "torch.full": lambda: torch.full([100, 32], 0, dtype=torch.float32, layout=torch.strided, device=cpu,
                                     pin_memory=False),
}, repeats=11)  # fmt: skip
for k, v in r.items():
    print(f"{k:32s} {v.median * 1e6:8.1f}")
