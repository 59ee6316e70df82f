"""Sequence-model operators: masks from lengths, positional encodings and relative position biases."""

from __future__ import annotations

import math

import torch

from tailjit.bench.registry import operator


def _lengths(batch, max_len, gen):
    """Valid lengths in [1, max_len]; the first sequence fills the padded length, as after collation."""
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lengths[0] = max_len
    return lengths


def _padded_inputs(size, gen):
    batch, steps, dim = (16, 128, 64) if size == "small" else (512, 512, 64)
    return torch.randn(batch, steps, dim, generator=gen), _lengths(batch, steps, gen)


def _scores_inputs(size, gen):
    batch, heads, steps = (16, 12, 64) if size == "small" else (16, 12, 384)
    return (torch.randn(batch, heads, steps, steps, generator=gen),)


def _sequence_mask_jax(feats, lengths):
    import jax.numpy as jnp

    mask = jnp.arange(feats.shape[1])[None, :] < lengths[:, None]
    return feats * mask[..., None].astype(feats.dtype), mask


@operator(
    domain="sequence",
    tags=("view", "broadcast"),
    reference="tf.sequence_mask; padding masks of seq2seq models (Sutskever et al. 2014)",
    inputs=_padded_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_sequence_mask_jax,
)
def sequence_mask(feats, lengths):
    """Zero the padded steps of ``feats`` (B, T, D) given per-sequence ``lengths``; returns (masked, mask)."""
    max_len = feats.size(1)
    steps = torch.arange(max_len, device=feats.device)
    mask = steps[None, :] < lengths[:, None]
    return feats * mask.unsqueeze(-1).to(feats.dtype), mask


def _attention_mask_inputs(size, gen):
    batch, heads, steps = (16, 8, 64) if size == "small" else (32, 8, 256)
    scores = torch.randn(batch, heads, steps, steps, generator=gen)
    return scores, _lengths(batch, steps, gen)


def _causal_padding_attention_jax(scores, lengths):
    import jax
    import jax.numpy as jnp

    steps = scores.shape[-1]
    causal = jnp.tril(jnp.ones((steps, steps), dtype=bool))
    key_valid = jnp.arange(steps)[None, :] < lengths[:, None]
    allowed = causal[None, None, :, :] & key_valid[:, None, None, :]
    return jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)


@operator(
    domain="sequence",
    tags=("view", "broadcast", "reduction"),
    reference="Transformer decoder self-attention masking (Vaswani et al. 2017)",
    inputs=_attention_mask_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_causal_padding_attention_jax,
)
def causal_padding_attention(scores, lengths):
    """Attention probabilities of scores (B, H, T, T) under a causal mask and a key padding mask."""
    steps = scores.shape[-1]
    causal = torch.ones(steps, steps, dtype=torch.bool, device=scores.device).tril()
    key_valid = torch.arange(steps, device=scores.device)[None, :] < lengths[:, None]
    allowed = causal[None, None, :, :] & key_valid[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _embeddings_inputs(size, gen):
    return _padded_inputs(size, gen)[:1]


def _sinusoidal_jax(x):
    import jax.numpy as jnp

    _, steps, dim = x.shape
    position = jnp.arange(steps, dtype=x.dtype)[:, None]
    div_term = jnp.exp(jnp.arange(0, dim, 2, dtype=x.dtype) * (-math.log(10000.0) / dim))
    pe = jnp.zeros((steps, dim), dtype=x.dtype)
    pe = pe.at[:, 0::2].set(jnp.sin(position * div_term))
    pe = pe.at[:, 1::2].set(jnp.cos(position * div_term))
    return x + pe[None]


@operator(
    domain="sequence",
    tags=("view", "broadcast", "inplace"),
    reference="sinusoidal positional encoding, Attention Is All You Need (Vaswani et al. 2017)",
    inputs=_embeddings_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_sinusoidal_jax,
)
def sinusoidal_positional_encoding(x):
    """Add the fixed sin/cos position table to token embeddings x (B, T, D)."""
    _, steps, dim = x.shape
    position = torch.arange(steps, dtype=x.dtype, device=x.device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=x.dtype, device=x.device) * (-math.log(10000.0) / dim))
    pe = torch.zeros(steps, dim, dtype=x.dtype, device=x.device)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return x + pe.unsqueeze(0)


def _rotary_inputs(size, gen):
    batch, heads, steps, dim = (16, 8, 128, 64) if size == "small" else (16, 16, 512, 64)
    q = torch.randn(batch, heads, steps, dim, generator=gen)
    return q, torch.randn(batch, heads, steps, dim, generator=gen)


def _rotary_jax(q, k):
    import jax.numpy as jnp

    steps, dim = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=q.dtype) / dim))
    freqs = jnp.outer(jnp.arange(steps, dtype=q.dtype), inv_freq)
    emb = jnp.concatenate((freqs, freqs), axis=-1)
    cos, sin = jnp.cos(emb)[None, None], jnp.sin(emb)[None, None]

    def rotate_half(x):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate((-x2, x1), axis=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rotate_half(x):
    """Map the two halves (x1, x2) of the last dimension to (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@operator(
    domain="sequence",
    tags=("view", "broadcast"),
    reference="rotary position embedding, RoFormer (Su et al. 2021)",
    inputs=_rotary_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_rotary_jax,
)
def rotary_embedding(q, k):
    """Rotate query/key pairs (B, H, T, Dh) by position-dependent angles (rotate-half layout)."""
    steps, dim = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=q.dtype, device=q.device) / dim))
    t = torch.arange(steps, dtype=q.dtype, device=q.device)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _alibi_slopes(n_heads):
    """Head slopes 2^(-8i/n); when n is not a power of two, the rest interleave from the next power."""
    base = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / base) for i in range(base)]
    if base < n_heads:
        extra = [2.0 ** (-8.0 * (i + 1) / (2 * base)) for i in range(0, 2 * base, 2)]
        slopes.extend(extra[: n_heads - base])
    return slopes


def _alibi_jax(scores):
    import jax.numpy as jnp

    slopes = jnp.asarray(_alibi_slopes(scores.shape[1]), dtype=scores.dtype)
    pos = jnp.arange(scores.shape[-1])
    distance = jnp.minimum(pos[None, :] - pos[:, None], 0).astype(scores.dtype)
    return scores + slopes[:, None, None] * distance[None]


@operator(
    domain="sequence",
    tags=("view", "broadcast", "loop", "branch", "container"),
    reference="ALiBi, Train Short, Test Long (Press et al. 2022)",
    inputs=_scores_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_alibi_jax,
)
def alibi_bias(scores):
    """Add ALiBi's per-head linear penalty on key distance to causal attention scores (B, H, T, T)."""
    n_heads, steps = scores.shape[1], scores.shape[-1]
    slopes = torch.tensor(_alibi_slopes(n_heads), dtype=scores.dtype, device=scores.device)
    pos = torch.arange(steps, device=scores.device)
    distance = (pos[None, :] - pos[:, None]).clamp(max=0).to(scores.dtype)
    return scores + slopes[:, None, None] * distance[None]


_T5_MAX_DISTANCE = 128


def _t5_inputs(size, gen):
    scores = _scores_inputs(size, gen)[0]
    return scores, 0.1 * torch.randn(32, scores.shape[1], generator=gen)


def _t5_jax(scores, table):
    import jax.numpy as jnp

    q_len, k_len = scores.shape[-2], scores.shape[-1]
    relative = jnp.arange(k_len)[None, :] - jnp.arange(q_len)[:, None]
    num_buckets = table.shape[0] // 2
    max_exact = num_buckets // 2
    n = jnp.abs(relative)
    ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(_T5_MAX_DISTANCE / max_exact)
    large = max_exact + (ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    buckets = (relative > 0).astype(jnp.int32) * num_buckets + jnp.where(n < max_exact, n, large)
    return scores + jnp.transpose(table[buckets], (2, 0, 1))[None]


@operator(
    domain="sequence",
    tags=("view", "broadcast", "adv-index"),
    reference="T5 relative position buckets (Raffel et al. 2020, Exploring the Limits of Transfer Learning)",
    inputs=_t5_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_t5_jax,
)
def t5_relative_position_bias(scores, table):
    """Add T5's bidirectional bucketed relative-position bias, looked up in table (buckets, H), to scores."""
    q_len, k_len = scores.shape[-2], scores.shape[-1]
    context = torch.arange(q_len, device=scores.device)[:, None]
    memory = torch.arange(k_len, device=scores.device)[None, :]
    relative = memory - context
    num_buckets = table.shape[0] // 2  # half the buckets for keys before the query, half after
    buckets = (relative > 0).long() * num_buckets
    n = relative.abs()
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # beyond max_exact, buckets grow logarithmically up to max_distance
    ratio = torch.log(n.float().clamp(min=1) / max_exact) / math.log(_T5_MAX_DISTANCE / max_exact)
    large = max_exact + (ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    buckets = buckets + torch.where(is_small, n, large)
    bias = table[buckets]
    return scores + bias.permute(2, 0, 1).unsqueeze(0)


def _reverse_inputs(size, gen):
    batch, steps, dim = (16, 128, 64) if size == "small" else (2048, 128, 64)
    return torch.randn(batch, steps, dim, generator=gen), _lengths(batch, steps, gen)


def _reverse_padded_jax(x, lengths):
    import jax.numpy as jnp

    t = jnp.arange(x.shape[1])[None, :]
    index = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return jnp.take_along_axis(x, index[:, :, None], axis=1)


@operator(
    domain="sequence",
    tags=("view", "loop", "inplace", "input-dependent"),
    reference="reverse_padded_sequence of bidirectional RNN code; tf.reverse_sequence",
    inputs=_reverse_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_reverse_padded_jax,
)
def reverse_padded_sequence(x, lengths):
    """Reverse the first ``lengths[b]`` steps of each sequence in x (B, T, D); padding stays put."""
    out = x.clone()
    for b in range(x.size(0)):
        n = lengths[b].item()
        out[b, :n] = x[b, :n].flip(0)
    return out
