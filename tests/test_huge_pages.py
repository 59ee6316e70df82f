"""Large kernel outputs are advised as transparent huge pages (``tj_huge_pages`` in runtime/capi.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").exists(), reason="no transparent huge pages (not Linux, or off)"
)

SCRIPT = textwrap.dedent(
    """
    import torch, tailjit
    from tailjit import te

    def advised(address):
        # the VmFlags of the mapping that holds ``address``: "hg" once madvise(MADV_HUGEPAGE) marked it
        inside = False
        for line in open("/proc/self/smaps"):
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(a, 16) for a in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return "hg" in line.split()
        return False

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    f = tailjit.build(te.compute((n,), lambda i: x[i] * 2 + 1, name="huge_probe"), [x])
    huge = 2 << 20
    for elements in (3 << 20, 9 << 20):  # 12 MiB, 36 MiB of float32
        xv = torch.randn(elements)
        y = f(xv)
        assert torch.equal(y, xv * 2 + 1)
        start = (y.data_ptr() + huge - 1) // huge * huge  # the first whole 2 MiB page inside the output
        print(elements, advised(start) if start + huge <= y.data_ptr() + 4 * elements else "small")
    """
)


@pytest.mark.parametrize("setting, large", [(None, "True"), ("0", "False")])
def test_large_outputs_are_advised_as_huge_pages(setting, large):
    """An output of at least 32 MiB (fresh from mmap on every call) has its 2 MiB-aligned part advised (the
    kernel's first writes then fault once per 2 MiB, not per 4 KiB page); smaller outputs, which come back
    from the heap, are left alone, and ``TAILJIT_HUGE_PAGES=0`` turns the advice off.  Values are the same
    either way."""
    env = {k: v for k, v in os.environ.items() if k != "TAILJIT_HUGE_PAGES"}
    if setting is not None:
        env["TAILJIT_HUGE_PAGES"] = setting
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    small, big = (line.split()[1] for line in out.stdout.splitlines())
    assert small in ("small", "False") and big == large, out.stdout
