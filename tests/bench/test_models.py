"""The five end-to-end models: build, shapes, determinism under a seed, and gradients of the train models."""

from __future__ import annotations

import pytest
import torch

from tailjit.bench.models import MODELS, ModelSpec
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
