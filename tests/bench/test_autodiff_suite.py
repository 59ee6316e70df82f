"""The autodiff suite (``tailjit bench --suite autodiff``) on small shapes: its gradients agree with
torch's and its report has a training-call (forward and backward) column against torch's fused op."""

import io

from rich.console import Console

from tailjit.bench import autodiff


def test_measure_and_report_small_cases():
    small = [
        autodiff.Case("max pool", autodiff._max_pool, autodiff._max_pool_torch,
                      lambda x: autodiff.F.max_pool2d(x, 3, 2), [(1, 2, 9, 9)]),
        autodiff.Case("gelu-gate chain", autodiff._gelu_chain, autodiff._gelu_chain_torch, None, [(64,), (64,)]),
    ]  # fmt: skip
    rows = autodiff.measure(threads=1, repeats=1, cases=small)  # measure checks each gradient against torch's
    assert [r["case"] for r in rows] == ["max pool", "gelu-gate chain"]
    pool, chain = rows
    for key in ("tailjit backward", "torch composite backward", "tailjit fw+bw", "torch fused backward",
                "torch fused fw+bw"):  # fmt: skip
        assert pool[key] > 0
    assert "torch fused fw+bw" not in chain and "torch fused backward" not in chain
    out = io.StringIO()
    autodiff.report(rows, 1, Console(file=out, width=250))
    text = out.getvalue()
    assert "torch fused fw+bw" in text and "gelu-gate chain" in text
