"""A built kernel's call never writes or reads memory it does not own, and never gives a silently wrong
answer: bad sizes, arguments and tensors raise clear Python errors."""

import functools
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te

# The program of the size tests: ``t`` (n x n) is a temporary (asserted below), read across the loop
# over ``p``; an expanded (n, 1) input of any n costs no memory.
_SIZES = """
import torch, tailjit
from tailjit import te
n, m = te.var("n"), te.var("m")
x = te.placeholder((n, 1), name="x")
w = te.placeholder((m,), name="w")
t = te.compute((n, n), lambda i, j: te.exp(te.sin(x[i, 0])) * te.log1p(te.abs(x[j, 0])), name="t")
k, l = te.reduce_axis(n, name="k"), te.reduce_axis(n, name="l")
y = te.compute((m,), lambda p: te.sum(te.sum(t[k, l] * w[p], axis=l), axis=k), name="y")
kern = tailjit.build(y, inputs=[x, w])
assert "t (temporary)" in kern.describe(), kern.describe()
flat = tailjit.build(te.compute((n * n,), lambda i: x[i // n, 0] * 2.0, name="flat"), inputs=[x, w])
torch.testing.assert_close(flat(torch.ones(3, 1), torch.ones(2)), torch.full((9,), 2.0))
# a row of (n * n,) held per row of the output: a row buffer
g = te.compute((m, n * n), lambda p, j: te.tanh(x[j // n, 0]) * te.exp(w[p] * 0.1), name="g")
k, l = te.reduce_axis(n * n, name="k"), te.reduce_axis(n * n, name="l")
norm = te.compute((m,), lambda p: te.sqrt(te.sum(g[p, k] * g[p, k], axis=k)), name="norm")
rows = tailjit.build(te.compute((m,), lambda p: te.sum(g[p, l] / norm[p], axis=l), name="rows"), inputs=[x, w])
assert "g (row buffer)" in rows.describe(), rows.describe()
for f, n in [(kern, 2**31), (kern, 2**32), (flat, 2**32), (rows, 2**31)]:
    try:
        print("returned:", f(torch.zeros(1).expand(n, 1), torch.ones(2)).shape)
    except MemoryError as e:
        print("raised:", e)
"""


def run_isolated(code: str) -> str:
    """Run ``code`` in a fresh interpreter (a crash fails the test instead of killing pytest); its stdout."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
    return res.stdout


def test_sizes_that_overflow_raise_memory_error():
    """A temporary's or a row buffer's byte count used to wrap in size_t: a block of one byte, which the
    kernel overran (SIGSEGV); an output dimension ``n * n`` wrapped to 0 (an empty result)."""
    assert run_isolated(_SIZES).splitlines() == [
        "raised: tailjit kernel 'y': a temporary of 4611686018427387904 elements of 4 bytes is too large",
        "raised: tailjit kernel 'y': a size, output or temporary overflows 64 bits for these input sizes",
        "raised: tailjit kernel 'flat': a size, output or temporary overflows 64 bits for these input sizes",
        "raised: tailjit kernel 'rows': out of memory for a row buffer",
    ]


def test_a_loop_bound_that_overflows_raises_memory_error():
    """A reduction over ``n * n`` with n = 2**32 (an expanded input) summed over the wrapped range 0: 0."""
    n = te.var("n")
    x = te.placeholder((n, 1), name="x")
    k = te.reduce_axis(n * n, name="k")
    s = tailjit.build(te.compute((1,), lambda i: te.sum(x[k // n, 0] + 1.0, axis=k), name="s"), [x])
    assert s(torch.ones(3, 1)).item() == 18.0
    with pytest.raises(MemoryError, match="'s': a size, output or temporary overflows 64 bits"):
        s(torch.zeros(1).expand(2**32, 1))


@functools.cache
def _flip_add():
    n = te.var("n")
    v, a, b = (te.placeholder((n,), name=s) for s in "vab")
    flip = tailjit.build(te.compute((n,), lambda i: v[n - 1 - i], name="flip"), [v])
    return flip, tailjit.build(te.compute((n,), lambda i: a[i] + b[i], name="add"), [a, b])


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_an_extra_positional_tensor_is_an_error_not_an_output(kind):
    """``flip(v, v)`` overwrote v while reading it, ``add(a, b, c)`` overwrote c: positional arguments
    are inputs only."""
    flip, add = _flip_add()
    v, c = torch.arange(4.0), torch.zeros(4)
    if kind == "numpy":
        v, c = v.numpy(), c.numpy()
    with pytest.raises(TypeError, match=r"'flip' takes 1 input\(s\) \(v\), got 2; output buffers go in out="):
        flip(v, v)
    with pytest.raises(TypeError, match=r"'add' takes 2 input\(s\) \(a, b\), got 3"):
        add(v, v, c)
    with pytest.raises(TypeError, match=r"'add' takes 2 input\(s\) \(a, b\), got 3"):
        add(v, v, c, out=c)
    assert list(v) == [0.0, 1.0, 2.0, 3.0] and not any(c)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["torch", "numpy"]), n=st.integers(1, 6), i=st.integers(0, 6), j=st.integers(0, 6))
def test_out_aliasing_an_input_gives_the_eager_answer(kind, n, i, j):
    """An out= buffer that overlaps an input, at any offset, is written after the input was read: numpy
    views of one array (tensors of storages of their own) were written in place while read."""
    flip, _ = _flip_add()
    whole = torch.arange(13.0)
    if kind == "numpy":
        whole = whole.numpy()
    src, dst = whole[i : i + n], whole[j : j + n]
    expect = torch.as_tensor(src).flip(0).clone()
    flip(src, out=dst)
    assert torch.equal(torch.as_tensor(dst), expect)


def test_out_bumps_the_version_counter():
    """A kernel writing an out= buffer that a backward saved: the backward used the overwritten values,
    where eager raises."""
    flip, _ = _flip_add()
    x, buf = torch.ones(3, requires_grad=True), torch.ones(3)
    y = x * buf  # saves buf for x's gradient
    flip(torch.arange(3.0), out=buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("out", ["leaf", "computed"])
def test_out_that_requires_grad_is_refused_under_grad_mode(out):
    """A leaf requiring grad written through out= was accepted where eager raises; under no_grad eager
    writes it, and so does the kernel."""
    flip, _ = _flip_add()
    leaf = torch.zeros(3, requires_grad=True)
    buf = leaf if out == "leaf" else leaf * 2
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic differentiation"):
        flip(torch.arange(3.0), out=buf)
    assert not buf.detach().any()
    with torch.no_grad():
        flip(torch.arange(3.0), out=buf)
    assert buf.tolist() == [2.0, 1.0, 0.0]


@pytest.mark.parametrize("kind", ["contiguous", "strided"])
def test_negative_views_are_read_and_written_as_their_values(kind):
    """A real view with the negative bit (``torch.complex(a, b).conj().imag``) holds the negated values in
    memory: kernels read and wrote that memory as it is, flipping the sign of inputs and outputs."""
    flip, add = _flip_add()
    x = torch.arange(4.0)
    neg = x._neg_view() if kind == "contiguous" else torch.complex(x, x).conj().imag
    assert neg.is_neg()
    torch.testing.assert_close(flip(neg), -x.flip(0))
    torch.testing.assert_close(add(neg, x), torch.zeros(4))
    out = torch.zeros(4)._neg_view() if kind == "contiguous" else torch.complex(x, x).conj().imag
    flip(x, out=out)
    torch.testing.assert_close(out.resolve_neg(), x.flip(0))


_UNSUPPORTED = {
    "complex": lambda: torch.zeros(4, dtype=torch.complex64),
    "conjugate": lambda: torch.zeros(4, dtype=torch.complex64).conj(),
    "bfloat16": lambda: torch.zeros(4, dtype=torch.bfloat16),
    "quantized": lambda: torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.quint8),
    "sparse": lambda: torch.zeros(4).to_sparse(),
    "mkldnn": lambda: torch.zeros(4).to_mkldnn(),
    "nested": lambda: torch.nested.nested_tensor([torch.zeros(4)]),
    "zero": lambda: torch._efficientzerotensor(4),
    "meta": lambda: torch.zeros(4, device="meta"),
}
_SAID = r"must have dtype float32|must be a dense \(strided\) tensor|must be a CPU tensor"


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized and nested tensors warn on creation
@pytest.mark.parametrize("kind", sorted(_UNSUPPORTED))
def test_unsupported_tensors_get_clear_errors(kind):
    """Sparse, mkldnn, nested and zero tensors as out= raised torch's internal errors (no storage), a
    nested input too."""
    flip, _ = _flip_add()
    with pytest.raises((TypeError, ValueError), match=f"tailjit kernel 'flip': input 'v' ({_SAID})"):
        flip(_UNSUPPORTED[kind]())
    with pytest.raises((TypeError, ValueError), match=f"tailjit kernel 'flip': out 'flip' ({_SAID})"):
        flip(torch.zeros(4), out=_UNSUPPORTED[kind]())
    if kind == "meta":  # strided: written by copy_, which took it
        with pytest.raises(ValueError, match="out 'flip' must be a CPU tensor"):
            flip(torch.zeros(4), out=torch.zeros(8, device="meta")[::2])


def test_a_compute_that_reads_itself_is_rejected():
    """A body assigned after the fact that loads its own tensor (not a te.scan's previous element) was
    built into a kernel reading its own uninitialised output."""
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    t = te.compute((n,), lambda i: x[i] + 1, name="t")
    t.body = t[t.axes[0]] + x[t.axes[0]]
    with pytest.raises(te.TEError, match="the program has a cycle: 't' reads 't'; .* only as a te.scan's"):
        tailjit.build(t, [x])


def test_a_cycle_through_several_computes_names_them():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i] * 2, name="a")
    b = te.compute((n,), lambda i: a[i] + 1, name="b")
    c = te.compute((n,), lambda i: b[i] + x[i], name="c")
    a.body = c[a.axes[0]] * 2
    with pytest.raises(te.TEError, match="the program has a cycle: 'c' reads 'b' reads 'a' reads 'c'"):
        tailjit.build(c, [x])
    with pytest.raises(te.TEError, match="the program has a cycle: 'c' reads 'b' reads 'a' reads 'c'"):
        te.gradient(c, [x])


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
@pytest.mark.parametrize("exponent", [-1, -3])
def test_integer_to_a_negative_python_int_power_is_refused(dtype, exponent):
    """``x ** -1`` on integers gave 0 where eager raises "Integers to negative integer powers are not
    allowed."."""
    n = te.var("n")
    x = te.placeholder((n,), dtype=dtype, name="x")
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        torch.ones(2, dtype=getattr(torch, dtype)) ** exponent
    with pytest.raises(te.TEError, match="Integers to negative integer powers are not allowed"):
        te.compute((n,), lambda i: x[i] ** exponent, name="y")
    with pytest.raises(te.TEError, match="Integers to negative integer powers are not allowed"):
        te.compute((n,), lambda i: te.pow(x[i], exponent), name="y")


@functools.cache
def _int_pow():
    n = te.var("n")
    x, e = te.placeholder((n,), dtype="int64", name="x"), te.placeholder((n,), dtype="int64", name="e")
    return tailjit.build(te.compute((n,), lambda i: x[i] ** e[i], name="ipow"), [x, e])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-4, 4), st.integers(-5, 5)), min_size=1, max_size=8))
def test_integer_powers_of_tensor_exponents_match_eager(pairs):
    """A tensor's negative exponents compute, as in eager (``2 ** -1`` is 0, ``-1 ** -3`` is -1)."""
    x, e = (torch.tensor(v, dtype=torch.int64) for v in zip(*pairs))
    assert torch.equal(_int_pow()(x, e), x**e)


@settings(max_examples=12, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=6), min_size=4, max_size=4, unique=True))
def test_any_str_is_a_valid_name(names):
    """Names go into C identifiers, strings and format strings: a newline, a quote or a backslash gave a C
    compile error, a '%' a format conversion reading garbage (a crash), a non-ASCII character a
    TypeError from PyErr_Format.  Messages show a printable name as it is."""
    nx, ny, no, nn = names
    n = te.var(nn)
    x, y = te.placeholder((n,), name=nx), te.placeholder((n,), name=ny)
    f = tailjit.build(te.compute((n,), lambda i: x[i] - y[i], name=no), [x, y])
    assert f(torch.arange(3.0), torch.ones(3)).tolist() == [-1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="inconsistent sizes") as e:
        f(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="must have dtype float32") as d:
        f(torch.ones(3), torch.ones(3, dtype=torch.float64))
    if all(s.isprintable() for s in names):
        assert str(e.value).startswith(f"tailjit kernel '{no}': input '{ny}' dimension 0 must be {nn} = 3 ")
        assert str(d.value).startswith(f"tailjit kernel '{no}': input '{ny}' must have dtype")
