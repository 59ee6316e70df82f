"""Bad definitions and bad inputs raise precise errors, never crash."""

import numpy as np
import pytest
import torch

import tailjit
from tailjit import te


def _add():
    n, m = te.var("n"), te.var("m")
    x, y = te.placeholder((n, m), name="x"), te.placeholder((n, m), name="y")
    return tailjit.build(te.compute((n, m), lambda i, j: x[i, j] + y[i, j], name="add"), [x, y])


def test_wrong_rank_dtype_device_count():
    f = _add()
    a = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"input 'y' must have 2 dimension\(s\), got 1"):
        f(a, torch.randn(4))
    with pytest.raises(TypeError, match="input 'y' must have dtype float32, got torch.float64"):
        f(a, a.double())
    with pytest.raises(TypeError, match=r"takes 2 input\(s\) \(x, y\), got 1"):
        f(a)
    with pytest.raises(ValueError, match="dense"):
        f(a, a.to_sparse())
    with pytest.raises(TypeError, match="must be a torch.Tensor or numpy.ndarray, got list"):
        f(a, [[1.0] * 4] * 3)
    with pytest.raises(TypeError, match="dtype float32"):
        f(np.zeros((3, 4)), np.zeros((3, 4)))  # float64 arrays: no silent cast


@pytest.mark.parametrize("transform", ["functionalize", "vmap", "fake"])
def test_tensors_without_data_are_refused_not_read(transform):
    """A tensor with elements but no memory (inside functionalize or vmap, or a fake one) has no data
    pointer: the kernel used to read through null, a segfault."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    f, a = _add(), torch.randn(3, 4)
    with pytest.raises(TypeError, match="input 'x' (holds no data|is a FakeTensor)"):
        if transform == "functionalize":
            torch.func.functionalize(f)(a, a)
        elif transform == "vmap":
            torch.vmap(f)(a.expand(2, 3, 4), a.expand(2, 3, 4))
        else:
            with FakeTensorMode():
                f(torch.randn(3, 4), torch.randn(3, 4))
    torch.testing.assert_close(f(a, a), a + a)


def test_inconsistent_sizes():
    f = _add()
    with pytest.raises(ValueError, match=r"input 'y' dimension 1 must be m = 4 .*got 5"):
        f(torch.randn(3, 4), torch.randn(3, 5))


def test_constant_dimension_checked():
    n = te.var("n")
    b = te.placeholder((n, 4), name="boxes")
    f = tailjit.build(te.compute((n,), lambda i: b[i, 2] - b[i, 0], name="w"), [b])
    with pytest.raises(ValueError, match="dimension 1 must be 4"):
        f(torch.randn(5, 3))


def test_malformed_definitions():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, "k")
    with pytest.raises(te.TEError, match="reduction axis 'k' is used outside a reduction"):
        te.compute((n,), lambda i: x[k] + x[i])
    with pytest.raises(te.TEError, match="has 1 dimension"):
        te.compute((n,), lambda i: x[i, i])
    with pytest.raises(te.TEError, match="fcompute takes 2"):
        te.compute((n,), lambda i, j: x[i])
    other = te.compute((n,), lambda i: x[i])
    with pytest.raises(te.TEError, match="belongs to another compute"):
        te.compute((n,), lambda j: x[other.axes[0]])
    with pytest.raises(TypeError, match="no truth value"):
        te.compute((n,), lambda i: x[i] if x[i] > 0 else 0)
    with pytest.raises(TypeError, match="must be an integer expression"):
        te.compute((n,), lambda i: x[i * 0.5])
    with pytest.raises(TypeError, match="select condition must be bool"):
        te.select(x[0], 1, 2)
    with pytest.raises(TypeError, match="unsupported dtype"):
        te.placeholder((n,), dtype="complex64")
    y = te.placeholder((n,), name="y")
    z = te.compute((n,), lambda i: x[i] + y[i], name="z")
    with pytest.raises(te.TEError, match="placeholder 'y' is used but not listed in inputs"):
        tailjit.build(z, [x])
    free = te.var("free")
    w = te.compute((free,), lambda i: te.cast(i, "float32"), name="w")
    with pytest.raises(te.TEError, match="size variable 'free' is not the size of any input"):
        tailjit.build(w, [x])


def test_provably_out_of_bounds_load_is_rejected():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    shifted = te.compute((n,), lambda i: x[i + 1], name="shifted")
    with pytest.raises(te.TEError, match=r"index 0 of x\[\(i \+ 1\)\] is out of bounds.*\[1, n\]"):
        tailjit.build(shifted, [x])
    # guarded by a select: fine, and only the taken branch reads memory
    guarded = te.compute((n,), lambda i: te.select(i + 1 < n, x[i + 1], 0.0), name="guarded")
    f = tailjit.build(guarded, [x])
    xv = torch.arange(5.0)
    assert torch.equal(f(xv), torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0]))
    # a compute sized to fit: fine
    diff = te.compute((n - 1,), lambda i: x[i + 1] - x[i], name="diff")
    g = tailjit.build(diff, [x])
    assert torch.equal(g(xv), torch.ones(4))
    assert g(torch.randn(1)).shape == (0,)
    with pytest.raises(ValueError, match="negative size"):
        g(torch.randn(0))


def test_unprovable_bounds_are_checked_at_call_time():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n,), name="x")
    idx_src = te.placeholder((m,), name="like")
    y = te.compute((m,), lambda j: x[j], name="y")  # fine only when m <= n
    f = tailjit.build(y, [x, idx_src])
    assert torch.equal(f(torch.arange(5.0), torch.empty(3)), torch.arange(3.0))
    with pytest.raises(IndexError, match="can fall outside"):
        f(torch.arange(5.0), torch.empty(6))


def test_data_dependent_index_is_guarded():
    n, m = te.var("n"), te.var("m")
    table = te.placeholder((n,), name="table")
    idx = te.placeholder((m,), "int64", name="idx")
    g = tailjit.build(te.compute((m,), lambda j: table[idx[j]], name="gather"), [table, idx])
    t = torch.arange(10.0)
    assert torch.equal(g(t, torch.tensor([3, 0, 9])), torch.tensor([3.0, 0.0, 9.0]))
    for bad in ([10], [-1], [2**40]):
        with pytest.raises(IndexError, match="out of bounds"):
            g(t, torch.tensor(bad))
    with pytest.raises(IndexError):
        g(torch.empty(0), torch.tensor([0]))


def test_missing_compiler_says_what_to_install(monkeypatch):
    from tailjit.runtime import compiler

    monkeypatch.setenv("CC", "definitely-not-a-compiler")
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    with pytest.raises(tailjit.CompilerNotFound, match="apt-get install gcc"):
        tailjit.build(te.compute((n,), lambda i: x[i] * 7.5 - 1.25, name="nocc"), [x])
    compiler._toolchain.cache_clear()


def test_vector_gathers_are_asked_for_only_where_the_compiler_takes_the_flag(tmp_path):
    """gcc 12 tunes vector gathers off for Intel server cores, which left every loop with a computed-index
    load scalar; the toolchain turns them on with ``-mtune-ctrl=use_gather`` where the compiler accepts it,
    and a compiler that rejects it (another vendor's, another architecture's gcc) gets no such flag."""
    import platform
    import shutil

    from tailjit.runtime import compiler

    rejects = tmp_path / "cc-rejects"
    rejects.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -mtune-ctrl=use_gather ] && exit 1; done\nexit 0\n')
    rejects.chmod(0o755)
    assert compiler._gather_flag(str(rejects)) == []
    assert compiler._gather_flag(str(tmp_path / "missing")) == []
    if platform.machine() in ("x86_64", "AMD64") and shutil.which("gcc"):
        assert compiler._gather_flag(shutil.which("gcc")) == ["-mtune-ctrl=use_gather"]


def test_the_gather_probe_runs_once_per_compiler_and_cache(monkeypatch, tmp_path):
    """A compiler that took the flag is remembered beside the precompiled prelude (the probe compile took 16
    ms of every process's start); one that rejected it is probed again."""
    from tailjit.runtime import compiler

    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    takes, rejects = tmp_path / "cc-takes", tmp_path / "cc-rejects"
    takes.write_text("#!/bin/sh\nexit 0\n")
    rejects.write_text("#!/bin/sh\nexit 1\n")
    for cc in (takes, rejects):
        cc.chmod(0o755)
    runs = []
    run = compiler.subprocess.run
    monkeypatch.setattr(compiler.subprocess, "run", lambda cmd, **kw: runs.append(cmd[0]) or run(cmd, **kw))
    for _ in range(3):
        assert compiler._gather_flag(str(takes)) == ["-mtune-ctrl=use_gather"]
        assert compiler._gather_flag(str(rejects)) == []
    assert runs.count(str(takes)) == 1 and runs.count(str(rejects)) == 3
    assert len(list((tmp_path / "pch").glob("gather-*.ok"))) == 1
