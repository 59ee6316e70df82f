"""The on-disk kernel cache across processes: hits, corruption, concurrency."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch, tailjit
    from tailjit import te
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.exp(x[i]) * 3 - x[i] / 7, name="cache_probe")
    start = time.perf_counter()
    f = tailjit.build(y, [x])
    seconds = time.perf_counter() - start
    xv = torch.linspace(-3, 3, 101)
    ok = torch.allclose(f(xv), torch.exp(xv) * 3 - xv / 7)
    print(f.build_info.cache, ok, f"{seconds:.4f}", f.build_info.path)
    """
)


def _run(cache: Path) -> tuple[str, bool, float, Path]:
    env = {**os.environ, "TAILJIT_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    how, ok, seconds, path = out.stdout.split()
    return how, ok == "True", float(seconds), Path(path)


def test_second_process_hits_the_disk_cache(tmp_path):
    how, ok, _, path = _run(tmp_path)
    assert (how, ok) == ("compiled", True)
    assert path.is_relative_to(tmp_path) and path.parent.name == path.name[:2]
    how, ok, _, path2 = _run(tmp_path)
    assert (how, ok, path2) == ("disk", True, path)


def test_corrupt_or_truncated_entry_is_rebuilt(tmp_path):
    _, _, _, path = _run(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])  # truncated
    how, ok, _, _ = _run(tmp_path)
    assert (how, ok) == ("compiled", True)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length, one flipped byte
    path.write_bytes(bytes(data))
    how, ok, _, _ = _run(tmp_path)
    assert (how, ok) == ("compiled", True)
    path.with_suffix(".sha256").unlink()  # a build interrupted before its checksum landed
    how, ok, _, _ = _run(tmp_path)
    assert (how, ok) == ("compiled", True)


def test_concurrent_builds_of_the_same_kernel_both_succeed(tmp_path):
    env = {**os.environ, "TAILJIT_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    results = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(r[1] == "True" for r in results)
    assert sorted(r[0] for r in results).count("compiled") == 1  # the others waited on the lock, then loaded
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert leftovers == []
