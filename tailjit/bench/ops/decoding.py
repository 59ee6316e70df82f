"""Decoding-time operators: greedy and beam search loops, CTC collapse, logits filtering and penalties."""

from __future__ import annotations

import torch

from tailjit.bench.registry import operator

_PAD, _BOS, _EOS = 0, 1, 2
_MAX_STEPS = 16


def _decoder_inputs(size, gen):
    """A tiny fixed RNN decoder: start state (B, D), embeddings (V, D), recurrence, output weights."""
    batch, dim, vocab = (32, 128, 1000) if size == "small" else (256, 256, 2000)
    hidden = torch.randn(batch, dim, generator=gen)
    embedding = torch.randn(vocab, dim, generator=gen)
    w_hidden = torch.randn(dim, dim, generator=gen) / dim**0.5
    w_out = torch.randn(dim, vocab, generator=gen) * (3.0 / dim**0.5)
    w_out[:, _EOS] += 0.3  # make EOS a plausible choice so sequences end at different steps
    return hidden, embedding, w_hidden, w_out


@operator(
    domain="decoding",
    tags=("view", "loop", "adv-index", "reduction", "container", "branch"),
    reference="greedy autoregressive decoding of seq2seq models (Sutskever et al. 2014)",
    inputs=_decoder_inputs,
)
def greedy_decode(hidden, embedding, w_hidden, w_out):
    """Pick the argmax token step by step; finished sequences emit PAD, stop early once all are done."""
    batch = hidden.size(0)
    tokens = torch.full((batch,), _BOS, dtype=torch.long, device=hidden.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=hidden.device)
    outputs = []
    for _ in range(_MAX_STEPS):
        hidden = torch.tanh(hidden @ w_hidden + embedding[tokens])
        tokens = (hidden @ w_out).argmax(dim=-1)
        tokens = tokens.masked_fill(finished, _PAD)
        outputs.append(tokens)
        finished = finished | (tokens == _EOS)
        if finished.all():
            break
    return torch.stack(outputs, dim=1)


_BEAM = 4
_LENGTH_ALPHA = 0.6


def _length_penalty(length, alpha):
    """GNMT length normalisation ((5 + |Y|) / 6)^alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def _beam_inputs(size, gen):
    if size == "small":
        return _decoder_inputs("small", gen)
    batch, dim, vocab = 32, 256, 2000
    hidden = torch.randn(batch, dim, generator=gen)
    embedding = torch.randn(vocab, dim, generator=gen)
    w_hidden = torch.randn(dim, dim, generator=gen) / dim**0.5
    w_out = torch.randn(dim, vocab, generator=gen) * (3.0 / dim**0.5)
    w_out[:, _EOS] += 0.3
    return hidden, embedding, w_hidden, w_out


@operator(
    domain="decoding",
    tags=("view", "broadcast", "loop", "adv-index", "reduction", "inplace"),
    reference="beam search with GNMT length penalty (Wu et al. 2016, Google's Neural Machine Translation)",
    inputs=_beam_inputs,
)
def beam_search(hidden, embedding, w_hidden, w_out):
    """Beam search (4 beams, fixed steps) over a tiny RNN decoder; returns best tokens (B, T) and scores."""
    batch, dim = hidden.shape
    vocab = w_out.size(1)
    k = _BEAM
    hidden = hidden.unsqueeze(1).expand(batch, k, dim).reshape(batch * k, dim)
    tokens = torch.full((batch * k,), _BOS, dtype=torch.long, device=hidden.device)
    scores = torch.zeros(batch, k, dtype=hidden.dtype, device=hidden.device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first one
    finished = torch.zeros(batch, k, dtype=torch.bool, device=hidden.device)
    lengths = torch.zeros(batch, k, dtype=hidden.dtype, device=hidden.device)
    history = torch.zeros(batch, k, 0, dtype=torch.long, device=hidden.device)
    eos_only = torch.full((vocab,), float("-inf"), dtype=hidden.dtype, device=hidden.device)
    eos_only[_EOS] = 0.0
    batch_offset = torch.arange(batch, device=hidden.device)[:, None] * k
    for _ in range(_MAX_STEPS):
        hidden = torch.tanh(hidden @ w_hidden + embedding[tokens])
        log_probs = torch.log_softmax(hidden @ w_out, dim=-1).view(batch, k, vocab)
        # a finished hypothesis can only be extended by EOS at no cost, so its score stays put
        log_probs = torch.where(finished[:, :, None], eos_only, log_probs)
        candidates = (scores[:, :, None] + log_probs).view(batch, k * vocab)
        scores, flat = candidates.topk(k, dim=-1)
        beam, new_tokens = flat // vocab, flat % vocab
        history = history.gather(1, beam[:, :, None].expand(-1, -1, history.size(2)))
        history = torch.cat((history, new_tokens[:, :, None]), dim=2)
        finished = finished.gather(1, beam)
        lengths = lengths.gather(1, beam) + (~finished).to(lengths.dtype)
        finished = finished | (new_tokens == _EOS)
        hidden = hidden.index_select(0, (beam + batch_offset).view(-1))
        tokens = new_tokens.view(-1)
    normalized = scores / _length_penalty(lengths, _LENGTH_ALPHA)
    best = normalized.argmax(dim=-1)
    rows = torch.arange(batch, device=hidden.device)
    return history[rows, best], normalized[rows, best]


_BLANK = 0


def _ctc_inputs(size, gen):
    batch, steps, classes = (16, 200, 32) if size == "small" else (2048, 200, 32)
    # frames repeat their label for a few steps, as acoustic models do, so collapsing has work to do
    # and about half of the segments are blank
    segments = torch.randint(1, classes, (batch, steps // 4), generator=gen)
    segments = segments * (torch.rand(batch, steps // 4, generator=gen) < 0.5)
    frame_labels = segments.repeat_interleave(4, dim=1)
    logits = torch.randn(batch, steps, classes, generator=gen)
    logits.scatter_add_(2, frame_labels[:, :, None], torch.full((batch, steps, 1), 4.0))
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=gen)
    return torch.log_softmax(logits, dim=-1), lengths


@operator(
    domain="decoding",
    tags=("view", "reduction", "loop", "inplace", "adv-index", "input-dependent"),
    reference="CTC best-path decoding (Graves et al. 2006, Connectionist Temporal Classification)",
    inputs=_ctc_inputs,
)
def ctc_greedy_decode(log_probs, lengths):
    """Best path per frame, then per sequence merge repeats and drop blanks; returns (labels, lengths)."""
    best = log_probs.argmax(dim=-1)
    batch, steps = best.shape
    decoded = torch.full((batch, steps), -1, dtype=torch.long, device=best.device)
    decoded_lengths = torch.zeros(batch, dtype=torch.long, device=best.device)
    for b in range(batch):
        path = best[b, : lengths[b]]
        keep = path != _BLANK
        keep[1:] &= path[1:] != path[:-1]
        labels = path[keep]
        decoded[b, : labels.numel()] = labels
        decoded_lengths[b] = labels.numel()
    return decoded, decoded_lengths


_TOP_K, _TOP_P = 50, 0.9


def _logits_inputs(size, gen):
    batch, vocab = (32, 32000) if size == "small" else (128, 50257)
    return (2.0 * torch.randn(batch, vocab, generator=gen),)


def _top_k_top_p_jax(logits):
    import jax
    import jax.numpy as jnp

    kth = jax.lax.top_k(logits, _TOP_K)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    order = jnp.argsort(-logits, axis=-1, stable=True)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    drop_sorted = cumulative > _TOP_P
    drop_sorted = jnp.concatenate((jnp.zeros_like(drop_sorted[:, :1]), drop_sorted[:, :-1]), axis=1)
    rows = jnp.arange(logits.shape[0])[:, None]
    drop = jnp.zeros_like(drop_sorted).at[rows, order].set(drop_sorted)
    return jnp.where(drop, -jnp.inf, logits)


@operator(
    domain="decoding",
    tags=("view", "reduction", "adv-index", "input-dependent", "inplace"),
    reference="top-k sampling (Fan et al. 2018) and nucleus sampling (Holtzman et al. 2020)",
    inputs=_logits_inputs,
    jax=_top_k_top_p_jax,
)
def top_k_top_p_filter(logits):
    """Keep the 50 best logits per row, then the smallest prefix holding 90% of the mass; -inf the rest."""
    logits = logits.clone()
    kth = torch.topk(logits, _TOP_K, dim=-1).values[:, -1:]
    logits[logits < kth] = float("-inf")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # drop a token once the tokens ranked before it already hold more than top_p of the mass
    drop_sorted = torch.zeros_like(cumulative, dtype=torch.bool)
    drop_sorted[:, 1:] = cumulative[:, :-1] > _TOP_P
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    logits[drop] = float("-inf")
    return logits


_REPETITION_PENALTY = 1.2


def _repetition_inputs(size, gen):
    batch, vocab, history = (32, 32000, 64) if size == "small" else (512, 50257, 512)
    logits = 2.0 * torch.randn(batch, vocab, generator=gen)
    return logits, torch.randint(0, vocab, (batch, history), generator=gen)


def _repetition_penalty_jax(logits, prev_tokens):
    import jax.numpy as jnp

    score = jnp.take_along_axis(logits, prev_tokens, axis=1)
    score = jnp.where(score < 0, score * _REPETITION_PENALTY, score / _REPETITION_PENALTY)
    rows = jnp.arange(logits.shape[0])[:, None]
    return logits.at[rows, prev_tokens].set(score)


@operator(
    domain="decoding",
    tags=("adv-index", "inplace"),
    reference="repetition penalty of CTRL (Keskar et al. 2019)",
    inputs=_repetition_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_repetition_penalty_jax,
)
def repetition_penalty(logits, prev_tokens):
    """Make already generated tokens less likely: divide positive logits by 1.2, multiply negative ones."""
    score = torch.gather(logits, 1, prev_tokens)
    score = torch.where(score < 0, score * _REPETITION_PENALTY, score / _REPETITION_PENALTY)
    logits = logits.clone()
    logits.scatter_(1, prev_tokens, score)
    return logits
