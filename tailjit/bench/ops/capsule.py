"""Capsule-network operators: squash, dynamic routing by agreement, margin loss (Sabour et al. 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tailjit.bench.registry import operator


def _squash_inputs(size, gen):
    batch = 32 if size == "small" else 512
    return (torch.randn(batch, 1152, 8, generator=gen),)


def _squash_jax(s):
    import jax.numpy as jnp

    sq_norm = (s**2).sum(axis=-1, keepdims=True)
    return sq_norm / (1 + sq_norm) * s / jnp.sqrt(sq_norm + 1e-8)


@operator(
    domain="capsule",
    tags=("reduction",),
    reference="squash non-linearity, Dynamic Routing Between Capsules (Sabour et al. 2017)",
    inputs=_squash_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_squash_jax,
)
def squash(s):
    """Shrink capsule vectors s (..., D) to length |s|^2 / (1 + |s|^2), keeping their direction."""
    sq_norm = (s**2).sum(dim=-1, keepdim=True)
    return sq_norm / (1 + sq_norm) * s / torch.sqrt(sq_norm + 1e-8)


_ROUTING_ITERS = 3


def _routing_inputs(size, gen):
    batch = 16 if size == "small" else 48
    return (0.05 * torch.randn(batch, 1152, 10, 16, generator=gen),)


def _routing_jax(u_hat):
    import jax

    logits = u_hat[..., 0] * 0.0  # zeros, but not a constant XLA would spend seconds folding
    for it in range(_ROUTING_ITERS):
        c = jax.nn.softmax(logits, axis=2)
        v = _squash_jax((c[..., None] * u_hat).sum(axis=1))
        if it < _ROUTING_ITERS - 1:
            logits = logits + (u_hat * v[:, None]).sum(axis=-1)
    return v


@operator(
    domain="capsule",
    tags=("view", "loop", "branch", "reduction", "broadcast"),
    reference="routing by agreement, Dynamic Routing Between Capsules (Sabour et al. 2017)",
    inputs=_routing_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_routing_jax,
)
def dynamic_routing(u_hat):
    """Route predictions u_hat (B, N_in, N_out, D) to output capsules (B, N_out, D) in 3 iterations."""
    logits = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=u_hat.device)
    for it in range(_ROUTING_ITERS):
        c = torch.softmax(logits, dim=2)
        s = (c.unsqueeze(-1) * u_hat).sum(dim=1)
        v = squash(s)
        if it < _ROUTING_ITERS - 1:
            logits = logits + (u_hat * v.unsqueeze(1)).sum(dim=-1)
    return v


def _margin_inputs(size, gen):
    batch = 128 if size == "small" else 65536
    v = 0.3 * torch.randn(batch, 10, 16, generator=gen)
    return v, torch.randint(0, 10, (batch,), generator=gen)


def _margin_jax(v, labels):
    import jax
    import jax.numpy as jnp

    lengths = jnp.linalg.norm(v, axis=-1)
    target = jax.nn.one_hot(labels, v.shape[1], dtype=v.dtype)
    present = target * jax.nn.relu(0.9 - lengths) ** 2
    absent = 0.5 * (1 - target) * jax.nn.relu(lengths - 0.1) ** 2
    return (present + absent).sum(axis=1).mean()


@operator(
    domain="capsule",
    tags=("view", "reduction"),
    reference="capsule margin loss (Sabour et al. 2017)",
    inputs=_margin_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_margin_jax,
)
def capsule_margin_loss(v, labels):
    """Margin loss on capsule lengths: m+ = 0.9 for the labelled class, m- = 0.1 (weight 0.5) otherwise."""
    lengths = v.norm(dim=-1)
    target = F.one_hot(labels, v.size(1)).to(v.dtype)
    present = target * F.relu(0.9 - lengths) ** 2
    absent = 0.5 * (1 - target) * F.relu(lengths - 0.1) ** 2
    return (present + absent).sum(dim=1).mean()
