"""Recommender-model operators: factorisation machines, cross networks, hashed embedding bags, DIN pooling."""

from __future__ import annotations

import torch

from tailjit.bench.registry import operator


def _fm_inputs(size, gen):
    batch, fields, dim = (256, 39, 16) if size == "small" else (32768, 39, 16)
    return (0.1 * torch.randn(batch, fields, dim, generator=gen),)


def _fm_jax(emb):
    square_of_sum = emb.sum(axis=1) ** 2
    sum_of_square = (emb**2).sum(axis=1)
    return 0.5 * (square_of_sum - sum_of_square).sum(axis=1, keepdims=True)


@operator(
    domain="recsys",
    tags=("reduction",),
    reference="factorization machines, second-order term in O(kn) (Rendle 2010)",
    inputs=_fm_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_fm_jax,
)
def fm_second_order(emb):
    """Sum of pairwise dot products of field embeddings (B, F, K) via (sum v)^2 - sum v^2; returns (B, 1)."""
    square_of_sum = emb.sum(dim=1).pow(2)
    sum_of_square = emb.pow(2).sum(dim=1)
    return 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)


def _ffm_inputs(size, gen):
    batch, fields, dim = (256, 10, 8) if size == "small" else (16384, 10, 8)
    return (0.1 * torch.randn(batch, fields, fields, dim, generator=gen),)


def _ffm_jax(emb):
    import jax.numpy as jnp

    pair = (emb * jnp.transpose(emb, (0, 2, 1, 3))).sum(axis=-1)
    upper = jnp.triu(jnp.ones(pair.shape[1:], dtype=bool), k=1)
    return jnp.where(upper[None], pair, 0.0).sum(axis=(1, 2))


@operator(
    domain="recsys",
    tags=("view", "loop", "reduction"),
    reference="field-aware factorization machines (Juan et al. 2016)",
    inputs=_ffm_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_ffm_jax,
)
def field_aware_fm(emb):
    """FFM interactions: emb[:, i, j] is feature i's vector for field j; sums <v_i,fj, v_j,fi> over i < j."""
    num_fields = emb.size(1)
    out = emb.new_zeros(emb.size(0))
    for i in range(num_fields):
        for j in range(i + 1, num_fields):
            out = out + (emb[:, i, j] * emb[:, j, i]).sum(dim=-1)
    return out


def _dcn_inputs(size, gen):
    batch, dim, layers = (256, 256, 3) if size == "small" else (8192, 512, 3)
    x0 = torch.randn(batch, dim, generator=gen)
    weights = torch.randn(layers, dim, generator=gen) / dim
    return x0, weights, 0.01 * torch.randn(layers, dim, generator=gen)


def _dcn_jax(x0, weights, biases):
    x = x0
    for layer in range(weights.shape[0]):
        x = x0 * (x @ weights[layer])[:, None] + biases[layer] + x
    return x


@operator(
    domain="recsys",
    tags=("view", "loop", "broadcast"),
    reference="Deep & Cross Network cross layers (Wang et al. 2017)",
    inputs=_dcn_inputs,
    differentiable=True,
    grad_argnums=(0, 1, 2),
    jax=_dcn_jax,
)
def dcn_cross_network(x0, weights, biases):
    """Stack of cross layers x_{l+1} = x0 (x_l . w_l) + b_l + x_l, with weights and biases (L, D)."""
    x = x0
    for layer in range(weights.size(0)):
        xw = x @ weights[layer]
        x = x0 * xw.unsqueeze(1) + biases[layer] + x
    return x


_HASH_MUL, _HASH_ADD = 1103, 12345


def _bag_inputs(size, gen):
    bags, buckets, dim = (256, 100_000, 32) if size == "small" else (16384, 1_000_000, 32)
    bag_sizes = torch.randint(1, 40, (bags,), generator=gen)
    offsets = torch.cumsum(bag_sizes, 0) - bag_sizes
    ids = torch.randint(0, 1_000_000, (int(bag_sizes.sum()),), generator=gen)
    return 0.1 * torch.randn(buckets, dim, generator=gen), ids, offsets


def _bag_jax(weight, ids, offsets):
    import jax
    import jax.numpy as jnp

    buckets = (ids * _HASH_MUL + _HASH_ADD) % weight.shape[0]
    bag = jnp.searchsorted(offsets, jnp.arange(ids.shape[0]), side="right") - 1
    return jax.ops.segment_sum(weight[buckets], bag, num_segments=offsets.shape[0])


@operator(
    domain="recsys",
    tags=("view", "adv-index", "inplace"),
    reference="hashing trick (Weinberger et al. 2009) with an EmbeddingBag-style sum over offsets",
    inputs=_bag_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_bag_jax,
)
def hashed_embedding_bag(weight, ids, offsets):
    """Hash raw feature ids into weight's buckets and sum each bag's rows; bag b starts at offsets[b]."""
    buckets = (ids * _HASH_MUL + _HASH_ADD) % weight.size(0)
    bag = torch.searchsorted(offsets, torch.arange(ids.numel(), device=ids.device), right=True) - 1
    out = weight.new_zeros(offsets.numel(), weight.size(1))
    out.index_add_(0, bag, weight[buckets])
    return out


def _din_inputs(size, gen):
    batch, steps, dim, hidden = (256, 50, 32, 64) if size == "small" else (2048, 50, 32, 64)
    query = torch.randn(batch, dim, generator=gen)
    keys = torch.randn(batch, steps, dim, generator=gen)
    lengths = torch.randint(1, steps + 1, (batch,), generator=gen)
    w1 = torch.randn(4 * dim, hidden, generator=gen) / (4 * dim) ** 0.5
    b1 = torch.zeros(hidden)
    w2 = torch.randn(hidden, 1, generator=gen) / hidden**0.5
    return query, keys, lengths, w1, b1, w2


def _din_jax(query, keys, lengths, w1, b1, w2):
    import jax
    import jax.numpy as jnp

    steps = keys.shape[1]
    q = jnp.broadcast_to(query[:, None, :], keys.shape)
    feats = jnp.concatenate((q, keys, q - keys, q * keys), axis=-1)
    scores = (jax.nn.sigmoid(feats @ w1 + b1) @ w2)[..., 0]
    mask = jnp.arange(steps)[None, :] < lengths[:, None]
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return (weights[..., None] * keys).sum(axis=1)


@operator(
    domain="recsys",
    tags=("view", "broadcast", "container", "reduction"),
    reference="Deep Interest Network local activation unit (Zhou et al. 2018)",
    inputs=_din_inputs,
    differentiable=True,
    grad_argnums=(0, 1, 3, 4, 5),
    jax=_din_jax,
)
def din_attention_pooling(query, keys, lengths, w1, b1, w2):
    """Pool a padded behaviour sequence keys (B, T, D) by MLP scores of [q, k, q-k, q*k] over valid steps."""
    batch, steps, dim = keys.shape
    q = query.unsqueeze(1).expand(-1, steps, -1)
    feats = torch.cat([q, keys, q - keys, q * keys], dim=-1)
    hidden = torch.sigmoid(feats @ w1 + b1)
    scores = (hidden @ w2).squeeze(-1)
    mask = torch.arange(steps, device=keys.device)[None, :] < lengths[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * keys).sum(dim=1)
