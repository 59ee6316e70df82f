"""Kernels' structural fingerprints (``tailjit.tunedb.fingerprint``): equal in two processes, blind to names, and
changed by any change of what a kernel computes."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_random_programs import BINARY, UNARY

from tailjit import api, te
from tailjit.fusion import partition
from tailjit.loop_merge import merge_loops
from tailjit.tunedb.fingerprint import fingerprint, size_bucket

LEAVES = 4


def _expr(tree, i, j, env):
    kind = tree[0]
    if kind == "leaf":
        x, b, m = env["x"], env["b"], env["m"]
        return [x[i, j], b[j], x[i, m - 1 - j], x[i, (j + 1) % m]][tree[1]]
    if kind == "const":
        return te.cast(tree[1], "float32")  # not a Python float: two of them would fold (and may divide by 0)
    if kind == "un":
        return UNARY[tree[1]][0](_expr(tree[2], i, j, env))
    return BINARY[tree[1]][0](_expr(tree[2], i, j, env), _expr(tree[3], i, j, env))


def kernels(spec, names="", static=None):
    """The kernels of the program ``spec`` (a JSON-able description) with every tensor and axis name prefixed
    by ``names``, over sizes ``static`` (a pair) or symbolic ones."""
    return merge_loops(partition(*program(spec, names, static))).kernels


def program(spec, names="", static=None):
    """The inputs and outputs of :func:`kernels`' program."""
    tree, scale, reduce_op = spec
    n, m = static or (te.var(names + "n"), te.var(names + "m"))
    x = te.placeholder((n, m), name=names + "x")
    b = te.placeholder((m,), name=names + "b")
    env = {"x": x, "b": b, "m": m}
    i, j = names + "i", names + "j"
    first = te.compute((n, m), _named([i, j], lambda a, c: _expr(tree, a, c, env) + x[a, c] * scale), names + "first")
    out = first
    if reduce_op is not None:
        k = te.reduce_axis(m, names + "k")
        red = te.compute((n,), _named([i], lambda a: getattr(te, reduce_op)(first[a, k], axis=k)), names + "red")
        out = te.compute((n, m), _named([i, j], lambda a, c: te.exp(red[a]) * first[a, c]), names + "out")
    return [x, b], [out]


def _named(params, f):
    """``f`` with its parameters called ``params``: ``te.compute`` names its axes after them."""
    return eval(f"lambda {', '.join(params)}: f({', '.join(params)})", {"f": f})


def trees():
    leaf = st.builds(lambda k: ("leaf", k), st.integers(0, LEAVES - 1)) | st.builds(
        lambda v: ("const", v), st.floats(-4, 4, allow_nan=False, width=32)
    )

    def extend(children):
        un = st.tuples(st.just("un"), st.integers(0, len(UNARY) - 1), children)
        bi = st.tuples(st.just("bin"), st.integers(0, len(BINARY) - 1), children, children)
        return un | bi

    return st.recursive(leaf, extend, max_leaves=8)


def programs():
    return st.tuples(trees(), st.floats(0.5, 3, width=32), st.sampled_from([None, "sum", "max"]))


def fingerprints(specs) -> list[list[str]]:
    return [[fingerprint(k) for k in kernels(spec)] for spec in specs]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(programs(), min_size=1, max_size=12))
def test_a_fresh_process_gives_the_same_fingerprints(specs):
    here = fingerprints(specs)
    tests = Path(__file__).parent
    script = "import json, sys; from test_tune_fingerprint import fingerprints; print(json.dumps(fingerprints(" \
             "json.loads(sys.stdin.read()))))"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(specs), capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    assert json.loads(proc.stdout) == here


def test_a_pickled_copy_gives_the_same_fingerprints():
    """(``tailjit.tune`` sends a program to its measuring worker pickled.)"""
    x = te.placeholder((te.var("n"), 64), name="x")
    k = te.reduce_axis((0, 64), name="k")
    y = te.compute((x.shape[0],), lambda i: te.sum(te.exp(x[i, k]), axis=k), name="y")
    kernels = api.prepare([y], [x], None, None)[0].kernels  # which makes some of the nodes' keys
    copy_y, copy_x = pickle.loads(pickle.dumps(([y], [x])))
    original = [fingerprint(k) for k in kernels]
    assert [fingerprint(k) for k in api.prepare(copy_y, copy_x, None, None)[0].kernels] == original


@settings(max_examples=60, deadline=None)
@given(programs(), st.booleans())
def test_renamed_copies_agree_and_a_changed_constant_differs(spec, static):
    sizes = (5, 7) if static else None
    original = [fingerprint(k) for k in kernels(spec, static=sizes)]
    assert [fingerprint(k) for k in kernels(spec, names="renamed_", static=sizes)] == original
    tree, scale, reduce_op = spec
    changed = [fingerprint(k) for k in kernels((tree, scale + 1, reduce_op), static=sizes)]
    assert changed != original


def test_sizes_dtypes_ops_and_constant_values_are_in_the_fingerprint():
    def one(f, static=None, dtype="float32", data=(1.0, 2.0), less=0):
        n = static or te.var("n")
        x = te.placeholder((n,), dtype, name="x")
        c = te.constant(list(data), name="c")
        y = te.compute((n - less,), lambda i: f(x[i]) + c[i % 2], name="y")
        return fingerprint(merge_loops(partition([x], [y])).kernels[0])

    base = one(te.exp)
    assert one(te.exp) == base
    assert len({base, one(te.log), one(te.exp, less=1), one(te.exp, static=64), one(te.exp, static=65),
                one(te.exp, dtype="float64"), one(te.exp, data=(1.0, 3.0))}) == 7  # fmt: skip


def test_scans_scatters_and_merged_kernels_have_fingerprints():
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    idx = te.placeholder((n,), "int64", name="idx")
    cs = te.scan((n, 4), 0, lambda prev, i, j: prev + x[i, j], dtype="float32", name="cs")
    rev = te.scan((n, 4), 0, lambda prev, i, j: prev + x[i, j], dtype="float32", reverse=True, name="rev")
    sc = te.scatter(cs, (n,), lambda i: ((idx[i], 0), x[i, 1]), combine="add", name="sc")
    program = merge_loops(partition([x, idx], [cs, rev, sc]))
    prints = [fingerprint(k) for k in program.kernels]
    assert len(set(prints)) == len(prints) == len(program.kernels)


def test_the_size_bucket_is_the_log2_of_the_static_points_else_dynamic():
    def bucket(shape):
        x = te.placeholder(shape, name="x")
        return size_bucket(partition([x], [te.compute(shape, lambda *i: x[i] * 2, name="y")]).kernels[0])

    assert bucket((20000, 80)) == "2^20"  # 1.6 million points
    assert bucket((4, 4)) == bucket((31,)) == "2^4"
    assert bucket((0, 3)) == "2^0"
    assert bucket((te.var("n"), 80)) == "dynamic"
