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


def test_the_runtime_module_is_built_once_and_shared(tmp_path):
    """The entry points' helpers live in one runtime module under ``pch``, built by the first kernel
    of a cache and only loaded by later ones; a corrupt runtime is rebuilt like a kernel."""
    _run(tmp_path)
    runtimes = sorted((tmp_path / "pch").glob("*.so"))
    assert len(runtimes) == 1
    built = runtimes[0].stat().st_mtime_ns
    how, ok, _, _ = _run(tmp_path)
    assert (how, ok) == ("disk", True) and runtimes[0].stat().st_mtime_ns == built
    runtimes[0].write_bytes(runtimes[0].read_bytes()[:1000])
    how, ok, _, _ = _run(tmp_path)
    assert (how, ok) == ("disk", True) and runtimes[0].stat().st_mtime_ns != built


def test_a_kernel_refuses_anything_but_the_runtime_table():
    import pytest
    import torch

    import tailjit
    from tailjit import te
    from tailjit.runtime import compiler

    x = te.placeholder((te.var("n"),), name="x")
    k = tailjit.build(te.compute(x.shape, lambda i: x[i] + 1, name="init_probe"), [x])
    with pytest.raises(TypeError):
        compiler._loaded[k.build_info.key].init(object())
    torch.testing.assert_close(k(torch.ones(3)), torch.full((3,), 2.0))  # the table it has stays
