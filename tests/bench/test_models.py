"""The five end-to-end models: build, shapes, determinism under a seed, gradients of the train models, and
values and gradients under both of tailjit's entries against eager."""

from __future__ import annotations

import pytest
import torch

import tailjit
from tailjit.bench.models import (
    MODELS,
    DCGANGenerator,
    LSTMLanguageModel,
    ModelSpec,
    _init_from,
    dqn,
    mobilenet_v2,
    resnet18,
)
from tailjit.bench.registry import SIZES

OUTPUT_SHAPE = {
    "resnet18": lambda b: (b, 1000),
    "mobilenet_v2": lambda b: (b, 1000),
    "lstm_lm": lambda b: (b, 35, 10000),
    "dqn": lambda b: (b, 18),
    "dcgan_generator": lambda b: (b, 3, 64, 64),
}


def _build(spec: ModelSpec, seed: int, global_seed: int) -> torch.nn.Module:
    """Build with a different global RNG state each time, so only ``gen`` may fix the weights."""
    torch.manual_seed(global_seed)
    return spec.build(torch.Generator().manual_seed(seed))


def _inputs(spec: ModelSpec, size: str, seed: int) -> tuple:
    return spec.make_inputs(size, torch.Generator().manual_seed(seed))


def test_the_five_models_are_registered():
    assert set(MODELS) == set(OUTPUT_SHAPE)
    assert {name for name, spec in MODELS.items() if spec.train} == {"resnet18", "lstm_lm"}
    for name, spec in MODELS.items():
        assert spec.name == name
        assert spec.reference


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_runs_deterministically_with_the_right_shape(name, size):
    spec = MODELS[name]
    first, second = _build(spec, 0, global_seed=1), _build(spec, 0, global_seed=2)
    assert not first.training and not second.training
    inputs = _inputs(spec, size, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(inputs, _inputs(spec, size, seed=3)))
    torch.manual_seed(4)  # dropout layers must be inactive in eval mode, whatever the global RNG
    with torch.no_grad():
        out = first(*inputs)
        torch.manual_seed(5)
        again = second(*inputs)
    batch = inputs[0].shape[0]
    assert batch == 1 if size == "small" else batch > 1
    assert out.shape == OUTPUT_SHAPE[name](batch)
    assert torch.isfinite(out).all()
    assert torch.equal(out, again)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_seed_changes_weights_and_inputs(name):
    spec = MODELS[name]
    a, b = _build(spec, 0, global_seed=0), _build(spec, 1, global_seed=0)
    for (pname, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pa.numel() > 1 and pa.std() > 0:
            assert not torch.equal(pa, pb), f"{name}.{pname} does not depend on the seed"
    assert not torch.equal(_inputs(spec, "small", 0)[0], _inputs(spec, "small", 1)[0])


@pytest.mark.parametrize("name", sorted(name for name, spec in MODELS.items() if spec.train))
def test_train_models_backprop_to_every_parameter(name):
    spec = MODELS[name]
    model = _build(spec, 0, global_seed=0)
    model(*_inputs(spec, "small", seed=1)).square().mean().backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, f"{pname} has no gradient"
        assert torch.isfinite(param.grad).all(), f"{pname} has a non-finite gradient"
        assert param.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


# ---------------------------------------------------------------- the models compiled by tailjit, against eager

#: Each model at a small size (its architecture, fewer classes, channels or tokens) and its inputs.
SMALL = {
    "resnet18": (lambda: resnet18(num_classes=10), lambda g: (torch.randn(2, 3, 32, 32, generator=g),)),
    "mobilenet_v2": (lambda: mobilenet_v2(num_classes=10), lambda g: (torch.randn(2, 3, 32, 32, generator=g),)),
    "lstm_lm": (lambda: LSTMLanguageModel(vocab=50, hidden=16), lambda g: (torch.randint(0, 50, (2, 7), generator=g),)),
    "dqn": (lambda: dqn(actions=6), lambda g: (torch.rand(2, 4, 84, 84, generator=g),)),
    "dcgan_generator": (lambda: DCGANGenerator(noise=16, width=4), lambda g: (torch.randn(2, 16, generator=g),)),
}
ENTRIES = {"jit": tailjit.jit, "compile": lambda m: torch.compile(m, backend="tailjit")}


def test_every_model_has_a_small_size():
    assert set(SMALL) == set(MODELS)


def _small(name):
    build, inputs = SMALL[name]
    gen = torch.Generator().manual_seed(0)
    return _init_from(build(), gen), inputs(gen)


def _close(what, got, want, rtol):
    """Within ``rtol`` of the largest magnitude of eager's values (float32 sums in another order)."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=rtol * scale, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("name", sorted(SMALL))
def test_model_inference_matches_eager(name, entry):
    model, inputs = _small(name)
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(*inputs)
        got = ENTRIES[entry](model)(*inputs)
    _close(f"{name} output", got, want, 1e-5)


#: the cases that take more than 20 s (2 shared cores)
SLOW = {("mobilenet_v2", "jit"), ("mobilenet_v2", "compile")}


@pytest.mark.parametrize(
    "name,entry",
    [pytest.param(n, e, marks=[pytest.mark.slow] if (n, e) in SLOW else []) for n in sorted(SMALL) for e in ENTRIES],
)
def test_model_training_matches_eager(name, entry):
    """The benchmark's fwbw: the output and every parameter's gradient of the output's sum (eval mode, as
    the models are built: no dropout draws, batch norm's running statistics)."""
    model, inputs = _small(name)
    want = model(*inputs)
    want.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    got = ENTRIES[entry](model)(*inputs)
    got.sum().backward()
    _close(f"{name} output", got.detach(), want.detach(), 1e-5)
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{name}.{n} has no gradient"
        _close(f"{name}.{n} gradient", p.grad, grads[n], 1e-4)
