"""The networks built from new operators (tailjit/bench/networks.py): each tailjit version trains
like its eager reference (losses and every parameter's gradient), and really runs tailjit kernels."""

import argparse
import json

import pytest
import torch
import torch.nn.functional as F

import tailjit
from tailjit.bench import networks as N
from tailjit.runtime.kernel import Kernel

# Small sizes keep the default run fast; the shapes still exercise every code path (uneven shift
# groups, several routing iterations, more than one step of every recurrence).
TINY = {
    "lltm": {"seq_len": 4, "batch": 3, "input_size": 5, "hidden": 7},
    "mi_lstm": {"seq_len": 4, "batch": 3, "input_size": 5, "hidden": 7},
    "scrnn": {"seq_len": 4, "batch": 3, "input_size": 5, "hidden": 7, "context": 6},
    "sublstm": {"seq_len": 4, "batch": 3, "input_size": 5, "hidden": 7},
    "capsule": {"batch": 3, "image": 25, "conv_channels": 4, "primary_types": 2, "primary_dim": 4, "classes": 3,
                "digit_dim": 5, "iterations": 3},
    "shift": {"batch": 2, "image": 6, "channels": 5, "expansion": 3, "blocks": 2, "classes": 4},
}  # fmt: skip

#: Backward nodes of the new operator's torch ops: present in the reference's graph, absent from the
#: tailjit version's (where the operator is one tailjit kernel).
REPLACED = {
    "lltm": {"EluBackward0", "SigmoidBackward0", "TanhBackward0"},
    "mi_lstm": {"SigmoidBackward0", "TanhBackward0"},
    "scrnn": {"MulBackward0"},  # the context update (its matrix products stay torch ops)
    "sublstm": {"SigmoidBackward0"},
    "capsule": {"SoftmaxBackward0", "DivBackward0"},
    "shift": {"CopySlices"},
}

#: tailjit kernel calls per forward at the TINY sizes.
CALLS = {"lltm": 4, "mi_lstm": 8, "scrnn": 1, "sublstm": 4, "capsule": 2, "shift": 2}

NAMES = list(N.NETWORKS)


def _setup(name, dtype):
    net = N.NETWORKS[name]
    ref, ours = N.build(net, seed=3, dtype=dtype, **TINY[name])
    data = N.make_data(net, 3, seed=3, dtype=dtype, **TINY[name])
    return net, ref, ours, data


def _graph_nodes(t: torch.Tensor) -> list[str]:
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack += [f for f, _ in fn.next_functions]
    return names


def _check(name, dtype, rtol, atol):
    net, ref, ours, data = _setup(name, dtype)
    x, y = data[0]
    want = net.loss(ref(x), y)
    got = net.loss(ours(x), y)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    want.backward()
    got.backward()
    theirs = dict(ref.named_parameters())
    for pname, p in ours.named_parameters():
        assert p.grad is not None, pname
        torch.testing.assert_close(p.grad, theirs[pname].grad, rtol=rtol, atol=atol, msg=lambda m, n=pname: f"{n}: {m}")
    ref.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    # the loss curve over a few SGD steps (momentum, so the steps compound any gradient error)
    curve_ref = N.train(ref, net, data, 4)
    curve_ours = N.train(ours, net, data, 4)
    torch.testing.assert_close(torch.tensor(curve_ours), torch.tensor(curve_ref), rtol=rtol, atol=atol)
    assert len(set(curve_ref)) > 1  # the parameters moved


@pytest.mark.parametrize("name", NAMES)
def test_float64_losses_and_gradients_match_eager(name):
    _check(name, torch.float64, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_float32_losses_and_gradients_match_eager(name):
    _check(name, torch.float32, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", NAMES)
def test_tailjit_version_runs_tailjit_kernels(name):
    net, ref, ours, data = _setup(name, torch.float32)
    x, y = data[0]
    ref_nodes = _graph_nodes(net.loss(ref(x), y))
    loss = net.loss(ours(x), y)
    nodes = _graph_nodes(loss)
    assert nodes.count("_KernelFunctionBackward") == CALLS[name], nodes
    assert "_KernelFunctionBackward" not in ref_nodes
    assert REPLACED[name] <= set(ref_nodes), sorted(set(ref_nodes))
    assert not REPLACED[name] & set(nodes), sorted(set(nodes))
    loss.backward()
    for op in net.ops:  # every op was built and differentiated by compiled kernels
        entries = [e for e in op._entries.values() if e._kernel is not None]
        assert entries, op
        assert any(isinstance(e.kernel, Kernel) and e.kernel._grad_kernels for e in entries), op


def test_shift_reference_moves_each_group_by_its_shift():
    x = torch.randn(2, 11, 5, 6)
    got = N.shift(x)
    padded = F.pad(x, (1, 1, 1, 1))
    for c in range(11):
        dh, dw = N.SHIFTS[c % 9]
        torch.testing.assert_close(got[:, c], padded[:, c, 1 + dh : 6 + dh, 1 + dw : 7 + dw], rtol=0, atol=0)
    torch.testing.assert_close(N.relu_shift(x), N.shift(F.relu(x)), rtol=0, atol=0)


def test_capsule_routing_op_matches_the_reference_loop():
    net = N.NETWORKS["capsule"]
    ref, _ = N.build(net, dtype=torch.float64, **TINY["capsule"])
    u_hat = torch.randn(2, 7, 3, 4, dtype=torch.float64)
    for iterations in (1, 2, 3):
        ref.iterations = iterations
        torch.testing.assert_close(N.capsule_routing(u_hat, iterations), ref.route(u_hat))


def test_bad_inputs_raise():
    net = N.NETWORKS["lltm"]
    ref, ours = N.build(net, **TINY["lltm"])
    with pytest.raises(ValueError, match="expects a \\(time, batch, features\\) sequence"):
        ours(torch.randn(3, 5))
    with pytest.raises(ValueError, match="unknown sizes \\['width'\\]"):
        N.build(net, width=3)
    with pytest.raises(ValueError, match="too small"):
        N.build(N.NETWORKS["capsule"], image=16)
    with pytest.raises(ValueError, match="expects \\(B, 3, H, W\\) images"):
        N.build(N.NETWORKS["shift"], **TINY["shift"])[1](torch.randn(2, 1, 6, 6))
    with pytest.raises(ValueError, match="unknown networks"):
        N.measure(["resnet"])


def test_tailjit_backend_trains_like_eager():
    # torch.compile(backend="tailjit") on the tailjit version: the ops are opaque custom ops
    net, ref, ours, data = _setup("lltm", torch.float32)
    compiled = torch.compile(ours, backend="tailjit")
    torch.testing.assert_close(
        torch.tensor(N.train(compiled, net, data, 3)), torch.tensor(N.train(ref, net, data, 3)), rtol=2e-4, atol=2e-5
    )


@pytest.mark.parametrize("name", ["lltm", "capsule"])
def test_tailjit_jit_of_the_module_trains_like_eager(name):
    """tailjit.jit(module): the parameters are inputs of its trace, the operators custom ops in it (calling
    their kernels on a trace's tensors was a segfault); no fallback to torch.compile."""
    net, ref, ours, data = _setup(name, torch.float32)
    jitted = tailjit.jit(ours)
    torch.testing.assert_close(
        torch.tensor(N.train(jitted, net, data, 3)), torch.tensor(N.train(ref, net, data, 3)), rtol=2e-4, atol=2e-5
    )
    assert not jitted.jitted.fallen and jitted.jitted.reports


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_variant_of_the_suite(name, tmp_path):
    row = N.measure_network(N.NETWORKS[name], steps=3, repeats=2, batch_s=0.01, **TINY[name])
    for variant, entry in row["variants"].items():
        assert "error" not in entry, (variant, entry)
        assert entry["max_rel_loss_diff"] < N.LOSS_RTOL, (variant, entry)
        assert entry["step_s"] > 0 and entry["first_step_s"] > 0


@pytest.mark.slow
def test_suite_cli_writes_json(tmp_path):
    from tailjit.bench.cli import add_arguments, main

    out = tmp_path / "networks.json"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args(["--suite", "networks", "--ops", "scrnn", "--json", str(out)])) == 0
    (row,) = json.loads(out.read_text())
    assert row["network"] == "scrnn" and set(row["variants"]) == set(N.VARIANTS)
