"""What a new process does for its first ``tailjit.jit`` call: only what that call needs (not timed: a module
loaded or a table built that the call does not need is the regression, whatever it costs on this machine)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# torch 2.13 imports torch._dynamo for any fake tensor (FakeTensorMode's constructor reads its config), so a
# trace cannot avoid it; AOTAutograd, Inductor's compile caches and the other Dynamo backends it can.
NOT_NEEDED = ["torch._functorch.aot_autograd", "torch._inductor.codecache", "torch._functorch.partitioners"]


def _first_call_modules(call: str) -> dict:
    script = textwrap.dedent(
        f"""
        import json, sys
        import torch, torch._dynamo

        walks = []  # export's decomposition table walks the dispatcher's registrations, all namespaces
        registrations = torch._C._dispatch_get_registrations_for_dispatch_key
        torch._C._dispatch_get_registrations_for_dispatch_key = lambda *a: walks.append(a) or registrations(*a)
        import tailjit
        f = tailjit.jit(lambda x: (x * 2 + 1).sum())
        out = {call}
        loaded = {{m: m in sys.modules for m in {NOT_NEEDED!r}}}
        print(json.dumps(dict(loaded, walks=len(walks))))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "call",
    [
        "f(torch.ones(10))",
        "f(torch.ones(10, requires_grad=True)).backward()",  # tailjit's own gradients: no AOTAutograd
    ],
)
def test_a_first_jit_call_imports_no_aot_autograd_or_inductor_caches_nor_walks_all_operators(call):
    loaded = _first_call_modules(call)
    assert not any(loaded.values()), loaded
