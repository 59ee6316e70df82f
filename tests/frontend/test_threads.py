"""tailjit.jit functions called for the first time from many threads at once."""

from __future__ import annotations

import threading

import torch

import tailjit

THREADS = 8
ROUNDS = 6


def _at_once(calls) -> list:
    """Each of ``calls`` on a thread of its own, all released by one barrier; their results (or errors)."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def work(i):
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as err:  # noqa: BLE001 - reported by the test as a wrong result
            results[i] = err

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _process_still_traces():
    """fx's global tracing flag is down and Dynamo still compiles: a trace interrupted by another thread's
    left them set, and every later torch.compile in the process failed."""
    assert not torch.fx._symbolic_trace.is_fx_tracing()
    assert torch.equal(torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3)), torch.full((3,), 3.0))


def _check(results, want):
    for got in results:
        assert not isinstance(got, Exception), repr(got)
        torch.testing.assert_close(got, want)


def test_first_calls_of_one_function_from_many_threads_trace_it_once_and_all_get_eagers_answer():
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    for r in range(ROUNDS):

        def f(a, b, r=r):
            return (a * b).sigmoid() + a.sum(1, keepdim=True) * (r + 1)

        g = tailjit.jit(f)
        _check(_at_once([lambda g=g: g(x, y)] * THREADS), f(x, y))
        assert len(g.entries) == 1 and g.fallback is None, g.fallback_reason
        _process_still_traces()


def test_first_calls_of_different_functions_from_many_threads():
    """Tracing is process-wide state: different functions traced at once interfered as much as one."""
    x = torch.randn(16, 8)
    for r in range(ROUNDS):
        fns = [lambda a, k=k, r=r: (a + k).exp() * (r + 1) - a.amax(0) for k in range(THREADS)]
        jitted = [tailjit.jit(f) for f in fns]
        results = _at_once([lambda g=g: g(x) for g in jitted])
        for g, f, got in zip(jitted, fns, results):
            _check([got], f(x))
            assert g.fallback is None, g.fallback_reason
        _process_still_traces()


SCALE = 2.0


def test_first_calls_of_a_closure_from_many_threads():
    """A function reading a global: its key's JitFunction and generated call are made once."""
    x = torch.randn(16, 8)
    for _ in range(ROUNDS):
        g = tailjit.jit(lambda a: a.tanh() * SCALE)
        _check(_at_once([lambda g=g: g(x)] * THREADS), x.tanh() * SCALE)
        assert len(g.traces) == 1 and g.fallback is None, g.fallback_reason
        _process_still_traces()
