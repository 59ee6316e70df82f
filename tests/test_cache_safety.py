"""The kernel cache is code: what this process loads from it, and how it writes it.

A cache folder or entry someone else could have written is never loaded; folders are private whatever the
umask; temporaries cannot be redirected and do not outlive an interrupted build; a cache that cannot be
used, a precompiled prelude that vanished or that gcc rejects, and a library the loader rejects all end in
a build that works."""

import hashlib
import os
import random
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.runtime import cachefiles, compiler
from tailjit.runtime.compiler import api

SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.umask(int(sys.argv[2], 8))
    import torch, tailjit
    from tailjit import te
    c = float(sys.argv[1])
    x = te.placeholder((te.var("n"),), name="x")
    f = tailjit.build(te.compute(x.shape, lambda i: te.exp(x[i]) * c - x[i] / 7, name="safety_probe"), [x])
    xv = torch.linspace(-3, 3, 101)
    print(f.build_info.cache, torch.allclose(f(xv), torch.exp(xv) * c - xv / 7), f.build_info.path)
    """
)


def _run(cache, c: float = 3.0, umask: int = 0o022, cwd=None, check=True) -> tuple[str, bool, Path, str]:
    """A new process's build of a small kernel: how the cache served it ("failed" where the process failed
    and not ``check``), whether it computed right, its library's path, and what it wrote to stderr."""
    env = {**os.environ, "TAILJIT_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, repr(c), oct(umask)], env=env, cwd=cwd, capture_output=True, text=True
    )
    assert proc.returncode == 0 or not check, proc.stderr[-3000:]
    how, ok, path = proc.stdout.split() if proc.returncode == 0 else ("failed", "False", "")
    return how, ok == "True", Path(path), proc.stderr


def _program():
    """A kernel no earlier build of this process has (a random constant): each build compiles anew."""
    c = float(random.randint(1, 10**9))
    x = te.placeholder((te.var("n"),), name="x")
    return tailjit.build(te.compute(x.shape, lambda i: x[i] * 2 + c, name="safety_kernel"), [x]), c


def _build_and_check():
    f, c = _program()
    xv = torch.randn(5)
    torch.testing.assert_close(f(xv), xv * 2 + c)
    return f.build_info


def _rewrite_keeping_sidecar(path: Path, data: bytes) -> None:
    """Write ``data`` to the entry ``path`` and a sidecar that agrees with it, in whatever form the sidecar
    had: what a user's own process (or an attacker who can write the cache) could do."""
    sidecar = path.with_suffix(".sha256")
    old = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(data)
    sidecar.write_text(sidecar.read_text().replace(old, hashlib.sha256(data).hexdigest()))


def _leftovers(cache: Path) -> list[str]:
    return [p.name for p in cache.rglob("*") if ".tmp" in p.name]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache that one process filled (runtime, precompiled preludes, one kernel): copied by each test
    that changes it."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    how, ok, _, _ = _run(cache)
    assert (how, ok) == ("compiled", True)
    return cache


EVIL = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) { close(open("MARKER", O_CREAT | O_WRONLY, 0600)); }
"""


def _plant(tmp_path: Path, target: Path) -> Path:
    """Put a library that, loaded, creates a marker file at ``target``, with an agreeing sidecar."""
    src = tmp_path / "evil.c"
    marker = tmp_path / "ran"
    src.write_text(EVIL.replace("MARKER", str(marker)))
    built = tmp_path / "evil.so"
    subprocess.run([compiler.toolchain().cc, "-shared", "-fPIC", str(src), "-o", str(built)], check=True)
    _rewrite_keeping_sidecar(target, built.read_bytes())
    return marker


def _make_foreign(path: Path, how: str) -> None:
    if how == "owner":
        os.chown(path, 65534, 65534)  # nobody's
    else:
        path.chmod(stat.S_IMODE(path.stat().st_mode) | (stat.S_IWGRP if how == "group" else stat.S_IWOTH))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize(
    "what, how",
    [
        ("runtime", "owner"),  # the attack of issue 45: pch/<key>.so and its sidecar swapped
        ("runtime", "group"),
        ("kernel", "others"),
        ("kernel sidecar", "owner"),
        ("kernel folder", "others"),
        ("cache", "group"),
        ("precompiled prelude", "others"),
    ],
)
def test_an_entry_or_folder_someone_else_could_write_is_never_loaded(warm_cache, tmp_path, what, how):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    (runtime,) = (cache / "pch").glob("*.so")
    (kernel,) = (p for p in cache.glob("*/*.so") if p.parent.name != "pch")
    target = {
        "runtime": runtime,
        "kernel": kernel,
        "kernel sidecar": kernel.with_suffix(".sha256"),
        "kernel folder": kernel.parent,
        "cache": cache,
        "precompiled prelude": next((cache / "pch").glob("*.gch")),
    }[what]
    marker = _plant(tmp_path, runtime if what == "runtime" else kernel)
    _make_foreign(target, how)
    # the preludes are read by a compile, which the planted kernel would spare: another kernel's
    how_built, ok, path, err = _run(cache, c=5.0 if what == "precompiled prelude" else 3.0, check=False)
    assert not marker.exists(), "the planted library ran"
    assert (how_built, ok) == ("compiled", True) and not path.is_relative_to(cache)
    assert "not using the kernel cache" in err and ("owned by uid 65534" if how == "owner" else "writable by") in err


def test_folders_are_private_and_entries_not_writable_by_others_whatever_the_umask(tmp_path):
    """Every folder tailjit makes (missing parents of the cache included) is mode 0700, and what it writes
    is writable by its owner alone even under umask 002: the next process trusts it."""
    cache = tmp_path / "a" / "b" / "cache"
    assert _run(cache, umask=0o002)[:2] == ("compiled", True)
    made = [tmp_path / "a", tmp_path / "a" / "b", *(p for p in [cache, *cache.rglob("*")] if p.is_dir())]
    assert {stat.S_IMODE(p.stat().st_mode) for p in made} == {0o700}
    assert not [p for p in cache.rglob("*") if p.stat().st_mode & 0o022]
    how, ok, _, err = _run(cache, umask=0o002)
    assert (how, ok) == ("disk", True) and "kernel cache" not in err


def test_a_relative_cache_dir_is_taken_from_the_working_folder(tmp_path, monkeypatch):
    how, ok, path, _ = _run("rel/cache", cwd=tmp_path)
    assert (how, ok) == ("compiled", True) and path.is_relative_to(tmp_path / "rel" / "cache")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAILJIT_CACHE_DIR", "rel2")
    assert compiler.cache_dir() == tmp_path / "rel2"
    monkeypatch.chdir(tmp_path / "rel")
    assert compiler.cache_dir() == tmp_path / "rel2"  # read once: a later chdir does not move it


@pytest.fixture
def immutable(tmp_path):
    """A folder no one may write, root included (``chattr +i``), removed again afterwards."""
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o700)
    yield folder
    subprocess.run(["chattr", "-R", "-i", str(folder)], capture_output=True)


def _chattr_immutable(folder: Path) -> None:
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("chattr +i is not available here")


def test_a_read_only_cache_serves_its_entries_and_builds_elsewhere(immutable, monkeypatch):
    assert _run(immutable)[:2] == ("compiled", True)
    for folder in [immutable, *immutable.rglob("*")]:
        if folder.is_dir():
            _chattr_immutable(folder)
    how, ok, path, err = _run(immutable)
    assert (how, ok) == ("disk", True) and "kernel cache" not in err and path.is_relative_to(immutable)
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(immutable))
    with pytest.warns(tailjit.CacheWarning, match="cannot be written"):
        info = _build_and_check()
    assert info.cache == "compiled" and not info.path.is_relative_to(immutable)


def test_a_cache_path_that_is_a_file_is_not_used(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "file"))
    with pytest.warns(tailjit.CacheWarning, match="is not a folder"):
        info = _build_and_check()
    assert info.cache == "compiled" and not info.path.is_relative_to(tmp_path)


def test_a_build_writes_through_no_link_planted_at_a_temporary_name(tmp_path, monkeypatch):
    """Temporaries had predictable names (``<name>.tmp<pid>.*``) opened through links: a link planted
    there made a build overwrite the file it points to."""
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_cores", lambda: 2)
    monkeypatch.setattr(compiler, "SPLIT_MIN_CHARS", 0)
    _build_and_check()  # the precompiled preludes, so that their names are known
    victim = tmp_path / "victim"
    victim.write_text("precious")
    tmp = f".tmp{os.getpid()}"

    def plant(folder: Path, names: list[str]) -> None:
        for name in names:
            (folder / name).symlink_to(victim)

    pch = tmp_path / "cache" / "pch"
    for header in pch.glob("prelude-*.h"):
        header.with_suffix(".h.sha256").unlink()  # the preludes are built again, at planted names
        stem = header.name.removesuffix(".h")
        plant(pch, [f"{stem}{tmp}.h", f"{stem}{tmp}.gch", f"{header.name}.gch{tmp}.sha256"])
    compile_ = compiler._compile

    def planting(source, folder, key, tc):
        parts = [".c", ".so", ".0.c", ".1.c", ".0.o", ".1.o"]
        plant(folder, [f"{key}{tmp}{p}" for p in parts] + [f"{key}.so{tmp}.sha256"])
        return compile_(source, folder, key, tc)

    monkeypatch.setattr(compiler, "_compile", planting)
    assert _build_and_check().cache == "compiled"
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("stage", ["prelude", "kernel"])
def test_an_interrupted_build_stops_its_compiler_and_leaves_no_temporaries(tmp_path, monkeypatch, stage, cores):
    """Ctrl-C while gcc runs (here: from its wait): gcc is stopped, no temporary file stays in the cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(compiler, "_cores", lambda: cores)
    compiler.toolchain(), api()  # this process's probes and runtime: the build below starts with gcc
    if stage == "kernel":
        _build_and_check()  # the precompiled preludes are there: the kernel's own compile is interrupted
    waited = []

    def interrupted(proc, *args, **kwargs):
        waited.append(proc)
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _program()
    assert waited and all(proc.poll() is not None for proc in waited)
    assert _leftovers(cache) == []


def test_a_precompiled_prelude_removed_during_a_build_is_rebuilt(tmp_path, monkeypatch):
    """``pch`` removed between the prelude's check and gcc's read of it (other processes' builds run): the
    unit is compiled with the prelude's text, and the next build makes the prelude anew."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(cache))
    _build_and_check()
    shutil.rmtree(cache / "pch")
    assert _build_and_check().cache == "compiled"  # removed before a build
    assert list((cache / "pch").glob("*.gch"))
    prelude = compiler._precompiled_prelude

    def vanishing(*args):
        header = prelude(*args)
        shutil.rmtree(cache / "pch", ignore_errors=True)
        return header

    monkeypatch.setattr(compiler, "_precompiled_prelude", vanishing)
    assert _build_and_check().cache == "compiled"  # removed during one
    monkeypatch.setattr(compiler, "_precompiled_prelude", prelude)
    _build_and_check()
    assert list((cache / "pch").glob("*.gch"))


@pytest.mark.parametrize("damage", ["garbled", "truncated"])
def test_a_precompiled_prelude_gcc_rejects_is_rebuilt(tmp_path, monkeypatch, damage):
    """A ``.gch`` damaged with its sidecar agreeing: gcc rejects it (a truncated one failed every later
    compile; a garbled one was silently parsed as text in every compile); it is rebuilt."""
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_cores", lambda: 2)  # two units: both preludes are read
    _build_and_check()
    for gch in (tmp_path / "pch").glob("*.gch"):
        data = bytearray(gch.read_bytes())
        if damage == "truncated":
            del data[len(data) // 3 :]
        else:
            data[16:4096] = bytes(b ^ 0x5A for b in data[16:4096])
        _rewrite_keeping_sidecar(gch, bytes(data))
    damaged = {gch: gch.read_bytes() for gch in (tmp_path / "pch").glob("*.gch")}
    assert _build_and_check().cache == "compiled"
    _build_and_check()
    assert all(gch.read_bytes() != data for gch, data in damaged.items())


@pytest.mark.parametrize("damage", ["elf header", "another kernel's"])
def test_a_library_the_loader_rejects_is_rebuilt(warm_cache, tmp_path, damage):
    """A cached library whose sidecar agrees with it, yet which does not load: rebuilt in the process that
    found it, never a raw ImportError (a wrong ELF version byte; a pair copied from another key)."""
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    (kernel,) = (p for p in cache.glob("*/*.so") if p.parent.name != "pch")
    if damage == "elf header":
        data = bytearray(kernel.read_bytes())
        data[6] ^= 0xFF  # EI_VERSION
        _rewrite_keeping_sidecar(kernel, bytes(data))
    else:
        _, _, other, _ = _run(cache, c=4.0)
        shutil.copy(other, kernel)
        shutil.copy(other.with_suffix(".sha256"), kernel.with_suffix(".sha256"))
    how, ok, path, _ = _run(cache)
    assert (how, ok, path) == ("compiled", True, kernel)
    assert _run(cache)[:2] == ("disk", True)


def test_a_cache_refused_in_a_process_is_left_for_its_private_folder_once(tmp_path, monkeypatch):
    """One warning for a refused cache; later builds of the process go to the same private folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(shared))
    with pytest.warns(tailjit.CacheWarning, match="writable by group or others") as warned:
        first, second = _build_and_check(), _build_and_check()
    assert len([w for w in warned if issubclass(w.category, tailjit.CacheWarning)]) == 1
    assert first.path.parent.parent == second.path.parent.parent == cachefiles.cache_dir() != shared
    assert list(shared.iterdir()) == []
