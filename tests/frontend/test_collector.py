"""No full garbage collection while tailjit compiles (``tailjit.runtime.collector``); young ones go on, and
the thresholds come back afterwards."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.runtime.collector import _NEVER, full_collections_deferred

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 14), reason="an incremental collector has no full collections")


@pytest.fixture
def eager_collector():
    """Thresholds low enough that any compile would start full collections; the test's own restored after."""
    old = gc.get_threshold()
    gc.set_threshold(20, 1, 1)
    try:
        yield (20, 1, 1)
    finally:
        gc.set_threshold(*old)


@pytest.fixture
def collections():
    """Each collection that starts while the test runs: its generation, and the oldest generation's
    threshold then (whether a full collection could have started instead)."""
    seen: list[tuple[int, int]] = []

    def note(phase, info):
        if phase == "start":
            seen.append((info["generation"], gc.get_threshold()[2]))

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


def _young_only(collections, share: float = 0.9):
    """The call collected young generations (these thresholds collect every few ms) and never the oldest;
    nor could it while tailjit compiled: during ``share`` of its collections at least (not the few of the
    checks before and after a compile; for torch.compile, not Dynamo's own tracing either)."""
    assert len(collections) > 5 and {g for g, _ in collections} <= {0, 1}
    assert sum(t == _NEVER for _, t in collections) >= share * len(collections)


def _gae(rewards, values):
    out = torch.zeros_like(rewards)
    g = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        g = rewards[t] - values[t] + 0.9 * g
        out[t] = g
    return out


def test_a_jit_compile_starts_no_full_collection(eager_collector, collections, tmp_path, monkeypatch):
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    f = tailjit.jit(_gae)
    r, v = torch.randn(12, 5), torch.randn(12, 5)
    gc.collect()
    collections.clear()
    got = f(r, v)
    _young_only(collections)
    torch.testing.assert_close(got, _gae(r, v))
    assert gc.get_threshold() == eager_collector  # full collections fall due again


def test_torch_compile_and_build_defer_too(eager_collector, collections, tmp_path, monkeypatch):
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.sin() * 2).sum(-1), backend="tailjit")
    x = torch.randn(6, 7)
    gc.collect()
    collections.clear()
    got = f(x)
    _young_only(collections, share=0.1)
    torch.testing.assert_close(got, (x.sin() * 2).sum(-1))
    a = te.placeholder((9,), name="a")
    collections.clear()
    k = tailjit.build(te.compute((9,), lambda i: a[i] * 3.0, name="b"), [a])
    _young_only(collections)
    torch.testing.assert_close(k(torch.ones(9)), torch.full((9,), 3.0))
    assert gc.get_threshold() == eager_collector


def test_nesting_threads_and_errors_restore_the_thresholds(eager_collector):
    with full_collections_deferred():
        assert gc.get_threshold() == (20, 1, _NEVER)
        with full_collections_deferred():
            pass
        assert gc.get_threshold() == (20, 1, _NEVER)  # the outer block still runs
        done = threading.Event()

        def other():
            with full_collections_deferred():
                pass
            done.set()

        threading.Thread(target=other).start()
        done.wait(10)
        assert gc.get_threshold() == (20, 1, _NEVER)  # another thread's compile ended, not this one
    assert gc.get_threshold() == eager_collector
    with pytest.raises(ValueError), full_collections_deferred():
        raise ValueError("a compile that fails")
    assert gc.get_threshold() == eager_collector


def test_thresholds_set_during_a_compile_are_kept(eager_collector):
    with full_collections_deferred():
        gc.set_threshold(50, 5, 5)
    assert gc.get_threshold() == (50, 5, 5)


def test_automatic_collection_turned_off_stays_off():
    old = gc.get_threshold()
    gc.set_threshold(0, old[1], old[2])
    try:
        with full_collections_deferred():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold() == (0, old[1], old[2])
    finally:
        gc.set_threshold(*old)
