"""The on-disk kernel cache across processes: hits, corruption, concurrency."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_a_one_kernel_unit_compiles_its_entry_points_beside_the_kernel(monkeypatch):
    """With one kernel (or little kernel text) the entry points, about 50 ms of gcc even at -O0, are a
    translation unit of their own, compiled at once with the kernel's."""
    import torch

    import tailjit
    from tailjit import te
    from tailjit.codegen import ENTRY_MARK, KERNEL_MARK, PRELUDE_END
    from tailjit.runtime import compiler

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.exp(x[i]) * 2.0, name="y_one_kernel")
    monkeypatch.setattr(compiler, "_cores", lambda: 2)
    seen = []
    split = compiler.split_units
    monkeypatch.setattr(compiler, "split_units", lambda body: seen.append(split(body)) or seen[-1])
    f = tailjit.build(y, x)
    (units,) = seen
    assert units is not None
    assert ENTRY_MARK in units[0] and KERNEL_MARK not in units[0]
    assert units[1].count(KERNEL_MARK) == 1 and ENTRY_MARK not in units[1]
    xv = torch.randn(7)
    torch.testing.assert_close(f(xv), xv.exp() * 2)
    monkeypatch.setattr(compiler, "_cores", lambda: 1)
    assert split(f.source.partition(PRELUDE_END)[2]) is None  # one core: one unit


def test_a_unit_split_in_two_translation_units_gives_the_same_kernels(monkeypatch):
    """Above ``SPLIT_MIN_CHARS`` of kernel C (and with two cores) a unit is compiled as two translation
    units at once and linked: every kernel lands in exactly one, the entry points see them all."""
    import torch

    import tailjit
    from tailjit import te
    from tailjit.codegen import KERNEL_MARK
    from tailjit.runtime import compiler

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    r = te.reduce_axis(n, "r")
    col = te.compute((m,), lambda j: te.sum(e[r, j], axis=r), name="col")
    y = te.compute((n, m), lambda i, j: e[i, j] / col[j], name="y")
    z = te.compute((n,), lambda i: te.sum(y[i, k] * x[i, k], axis=k), name="z")
    monkeypatch.setattr(compiler, "SPLIT_MIN_CHARS", 0)
    monkeypatch.setattr(compiler, "_cores", lambda: 2)
    seen = []
    split = compiler.split_units
    monkeypatch.setattr(compiler, "split_units", lambda body: seen.append(split(body)) or seen[-1])
    f = tailjit.build([y, z], [x], name="split_probe")
    (units,) = seen
    assert units is not None and all(KERNEL_MARK in u for u in units)
    assert sum(u.count(KERNEL_MARK) for u in units) == f.source.count(KERNEL_MARK) >= 2
    xv = torch.randn(9, 5, dtype=torch.float32)
    ev = torch.exp(xv - xv.amax(1, keepdim=True))
    yv = ev / ev.sum(0)
    got_y, got_z = f(xv)
    torch.testing.assert_close(got_y, yv)
    torch.testing.assert_close(got_z, (yv * xv).sum(1))


def test_the_runtime_probes_read_plain_tensors_under_fake_mode_and_no_grad():
    """A process's first build may happen inside AOTAutograd's compile (fake mode, grad off): the layout
    probes still see plain tensors that require grad (the autograd offset had come out -1, the slow path,
    for the whole process, and a fake tensor's data pointer was read)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tailjit.runtime.objects import runtime_objects

    probe = runtime_objects.__wrapped__
    want = probe()
    with FakeTensorMode(), torch.no_grad():
        got = probe()
    assert got == want


@pytest.mark.parametrize("direct", [True, False], ids=["ld", "driver"])
@pytest.mark.parametrize("cores", [1, 2])
def test_a_library_links_with_the_linker_itself_or_through_the_driver(monkeypatch, tmp_path, direct, cores):
    """gcc's link run as ``ld`` itself, without what the process already has: the library loads and
    computes, and its references to the C library keep their versions.  A toolchain without that command
    (another compiler) links through the driver.  One translation unit or two."""
    import dataclasses
    import random

    import torch

    import tailjit
    from tailjit import te
    from tailjit.runtime import compiler

    tc = compiler.toolchain()
    if direct and tc.link is None:
        pytest.skip("the compiler is not gcc, or its direct link did not load")
    if not direct:
        monkeypatch.setattr(compiler, "toolchain", lambda: dataclasses.replace(tc, link=None))
    monkeypatch.setattr(compiler, "SPLIT_MIN_CHARS", 0)
    monkeypatch.setattr(compiler, "_cores", lambda: cores)
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    commands = []
    run = compiler._run
    monkeypatch.setattr(compiler, "_run", lambda cmd, *paths: commands.append(cmd) or run(cmd, *paths))
    c = float(random.randint(1, 10**6))  # a new source: no process-wide cache has it
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k, k2 = te.reduce_axis(m, "k"), te.reduce_axis(m, "k2")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    # a row of e read backwards: a row buffer of its own, which the kernel mallocs and frees
    y = te.compute((n, m), lambda i, j: e[i, m - 1 - j] / s[i] * c, name="y")
    f = tailjit.build(y, [x], name="link_probe")
    assert "e (row buffer)" in f.kernels[0].fused
    assert f.build_info.cache == "compiled" and f.build_info.path.parent.parent == tmp_path
    assert commands[-1][0] == (tc.link[0] if direct else tc.cc)  # the kernel's link (or whole compile)
    xv = torch.randn(9, 5, dtype=torch.float32)
    torch.testing.assert_close(f(xv), torch.softmax(xv, 1).flip(1) * c)
    if direct and shutil.which("readelf"):  # the C library still linked: its symbols keep their versions
        symbols = subprocess.run(
            ["readelf", "-W", "-d", "--dyn-syms", str(f.build_info.path)], capture_output=True, text=True
        )
        assert "libc.so.6" in symbols.stdout and "malloc@GLIBC_" in symbols.stdout


def test_no_direct_link_where_the_compiler_is_not_gcc(tmp_path):
    from tailjit.runtime import compiler

    silent = tmp_path / "cc-silent"  # builds nothing and describes no link
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    assert compiler._direct_link(str(silent), [], []) is None
    assert compiler._direct_link(str(tmp_path / "missing"), [], []) is None
    tc = compiler.toolchain()
    if tc.link is not None:
        assert not set(compiler.PROCESS_LIBS) & set(tc.link) and tc.link.count(compiler.OBJECTS) == 1


def test_a_direct_link_is_probed_once_per_cache(monkeypatch, tmp_path):
    """The probe library (a compile, a link, a load: 40 ms) runs once per toolchain and cache, not in every
    process; a command whose probe fails is not remembered."""
    from tailjit.runtime import compiler

    tc = compiler.toolchain()
    if tc.link is None:
        pytest.skip("the compiler is not gcc, or its direct link did not load")
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    probes = []
    probe = compiler._links_and_loads
    monkeypatch.setattr(compiler, "_links_and_loads", lambda *a: probes.append(a) or probe(*a))
    args = (tc.cc, list(tc.flags), list(tc.libs))
    assert compiler._direct_link(*args) == tc.link and len(probes) == 1
    assert compiler._direct_link(*args) == tc.link and len(probes) == 1  # remembered
    assert len(list((tmp_path / "pch").glob("link-*.ok"))) == 1
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setattr(compiler, "_links_and_loads", lambda *a: False)
    assert compiler._direct_link(*args) is None
    assert not (tmp_path / "other" / "pch").exists()
