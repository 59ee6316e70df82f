"""Metric-learning losses and margin-based logits (re-identification, face recognition, contrastive SSL).

Eager PyTorch in the style of the reference implementations: the per-anchor mining loop of
batch-hard triplet, pair selection by index, one-hot margins written with scatter or indexed
assignment, and masked positive/negative sets.  Most have a ``jax.numpy`` twin.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tailjit.bench.registry import operator

# ----------------------------------------------------------------------------------------------
# Input generators
# ----------------------------------------------------------------------------------------------


def _pk_batch(p, k, d, gen):
    """A P x K batch: P identities with K samples each, embeddings near their identity's mean."""
    means = 0.4 * torch.randn(p, d, generator=gen)
    emb = means.repeat_interleave(k, dim=0) + torch.randn(p * k, d, generator=gen)
    labels = torch.arange(p).repeat_interleave(k)
    return emb, labels


def _pk_batch_inputs(size, gen):
    """Re-identification batches (ResNet-50 features at large size)."""
    return _pk_batch(*((32, 4, 128) if size == "small" else (128, 4, 2048)), gen)


def _pair_batch_inputs(size, gen):
    """Batches for all-pairs losses: every pair i < j is materialised, so the large embedding is narrow."""
    return _pk_batch(*((32, 4, 128) if size == "small" else (128, 4, 64)), gen)


def _center_inputs(size, gen):
    n, d, c = (256, 128, 100) if size == "small" else (8192, 512, 10_000)
    feats = torch.randn(n, d, generator=gen)
    labels = torch.randint(0, c, (n,), generator=gen)
    centers = torch.randn(c, d, generator=gen) * 0.1
    return feats, labels, centers


def _face_inputs(size, gen):
    """Face embeddings, classifier weights (one row per identity) and labels."""
    n, d, c = (128, 512, 1000) if size == "small" else (256, 512, 20_000)
    emb = torch.randn(n, d, generator=gen)
    weight = torch.randn(c, d, generator=gen)
    labels = torch.randint(0, c, (n,), generator=gen)
    return emb, weight, labels


def _supcon_inputs(size, gen):
    """Two augmented views per image: (N, 2, D) projections and N class labels."""
    n, c, d = (256, 10, 128) if size == "small" else (1024, 100, 128)
    labels = torch.randint(0, c, (n,), generator=gen)
    means = torch.randn(c, d, generator=gen)
    feats = means[labels][:, None, :] + torch.randn(n, 2, d, generator=gen)
    return F.normalize(feats, dim=2), labels


def _infonce_inputs(size, gen):
    """MoCo-style queries, positive keys and a queue of negative keys."""
    n, k, d = (256, 4096, 128) if size == "small" else (256, 65_536, 128)
    q = torch.randn(n, d, generator=gen)
    pos = q + 0.5 * torch.randn(n, d, generator=gen)
    queue = F.normalize(torch.randn(k, d, generator=gen), dim=1)
    return q, pos, queue


# ----------------------------------------------------------------------------------------------
# Pair / triplet losses
# ----------------------------------------------------------------------------------------------


def _euclidean_dist(x, y):
    """Pairwise Euclidean distances via |x|^2 + |y|^2 - 2 x.y (clamped before the square root)."""
    xx = x.pow(2).sum(1, keepdim=True)
    yy = y.pow(2).sum(1, keepdim=True).t()
    return (xx + yy - 2 * x @ y.t()).clamp(min=1e-12).sqrt()


def _triplet_batch_hard_jax(emb, labels, margin=0.3):
    import jax.numpy as jnp

    sq = (emb * emb).sum(1)
    dist = jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2 * emb @ emb.T, 1e-12))
    same = labels[:, None] == labels[None, :]
    dist_ap = jnp.where(same, dist, -jnp.inf).max(1)
    dist_an = jnp.where(same, jnp.inf, dist).min(1)
    return jnp.maximum(dist_ap - dist_an + margin, 0).mean()


@operator(
    domain="metric-learning",
    tags=("view", "reduction", "loop", "adv-index", "input-dependent", "container", "broadcast"),
    reference="Hermans et al., In Defense of the Triplet Loss for Person Re-Identification, 2017",
    inputs=_pk_batch_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_triplet_batch_hard_jax,
)
def triplet_batch_hard(emb, labels, margin=0.3):
    """Batch-hard triplet loss: per anchor, the farthest positive against the closest negative."""
    n = emb.size(0)
    dist = _euclidean_dist(emb, emb)
    mask = labels.expand(n, n).eq(labels.expand(n, n).t())
    dist_ap, dist_an = [], []
    for i in range(n):
        dist_ap.append(dist[i][mask[i]].max().unsqueeze(0))
        dist_an.append(dist[i][mask[i] == 0].min().unsqueeze(0))
    dist_ap = torch.cat(dist_ap)
    dist_an = torch.cat(dist_an)
    return F.relu(dist_ap - dist_an + margin).mean()


def _contrastive_loss_jax(emb, labels, margin=1.5):
    import jax.numpy as jnp

    n = emb.shape[0]
    emb = emb / jnp.maximum(jnp.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    i, j = jnp.triu_indices(n, 1)
    d = jnp.sqrt(jnp.maximum(((emb[i] - emb[j]) ** 2).sum(1), 1e-12))
    same = (labels[i] == labels[j]).astype(emb.dtype)
    loss = same * d**2 + (1 - same) * jnp.maximum(margin - d, 0) ** 2
    return 0.5 * loss.mean()


@operator(
    domain="metric-learning",
    tags=("view", "reduction", "adv-index"),
    reference="Hadsell, Chopra, LeCun, Dimensionality Reduction by Learning an Invariant Mapping, CVPR 2006",
    inputs=_pair_batch_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_contrastive_loss_jax,
)
def contrastive_loss(emb, labels, margin=1.5):
    """Contrastive loss over all pairs i < j of unit embeddings: pull same labels, push others away."""
    n = emb.shape[0]
    emb = F.normalize(emb, dim=1)
    i, j = torch.triu_indices(n, n, offset=1)
    d = (emb[i] - emb[j]).pow(2).sum(1).clamp(min=1e-12).sqrt()
    same = (labels[i] == labels[j]).to(emb.dtype)
    loss = same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2)
    return 0.5 * loss.mean()


def _center_loss_jax(feats, labels, centers):
    import jax.numpy as jnp

    return 0.5 * ((feats - jnp.take(centers, labels, axis=0)) ** 2).sum(1).mean()


@operator(
    domain="metric-learning",
    tags=("reduction", "adv-index"),
    reference="Wen et al., A Discriminative Feature Learning Approach for Deep Face Recognition, ECCV 2016",
    inputs=_center_inputs,
    differentiable=True,
    grad_argnums=(0, 2),
    jax=_center_loss_jax,
)
def center_loss(feats, labels, centers):
    """Center loss: half the squared distance of each feature to its class center, batch-averaged."""
    return 0.5 * (feats - centers[labels]).pow(2).sum(1).mean()


# ----------------------------------------------------------------------------------------------
# Margin-based softmax logits
# ----------------------------------------------------------------------------------------------


def _arcface_logits_jax(emb, weight, labels, s=64.0, m=0.5):
    import jax
    import jax.numpy as jnp

    def normalize(x):
        return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    cos = normalize(emb) @ normalize(weight).T
    sin = jnp.sqrt(jnp.maximum(1.0 - cos * cos, 1e-7))
    phi = cos * math.cos(m) - sin * math.sin(m)
    phi = jnp.where(cos > math.cos(math.pi - m), phi, cos - math.sin(math.pi - m) * m)
    one_hot = jax.nn.one_hot(labels, cos.shape[1], dtype=cos.dtype)
    return s * (one_hot * phi + (1 - one_hot) * cos)


@operator(
    domain="metric-learning",
    tags=("view", "adv-index", "inplace"),
    reference="Deng et al., ArcFace: Additive Angular Margin Loss for Deep Face Recognition, CVPR 2019",
    inputs=_face_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_arcface_logits_jax,
)
def arcface_logits(emb, weight, labels, s=64.0, m=0.5):
    """Scaled logits with cos(theta + m) at the target class (linear fallback past pi - m)."""
    cos = F.linear(F.normalize(emb), F.normalize(weight))
    sin = (1.0 - cos * cos).clamp(min=1e-7).sqrt()
    phi = cos * math.cos(m) - sin * math.sin(m)
    phi = torch.where(cos > math.cos(math.pi - m), phi, cos - math.sin(math.pi - m) * m)
    one_hot = torch.zeros_like(cos)
    one_hot.scatter_(1, labels.view(-1, 1), 1.0)
    return s * (one_hot * phi + (1.0 - one_hot) * cos)


def _cosface_logits_jax(emb, weight, labels, s=64.0, m=0.35):
    import jax
    import jax.numpy as jnp

    def normalize(x):
        return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    cos = normalize(emb) @ normalize(weight).T
    return s * (cos - m * jax.nn.one_hot(labels, cos.shape[1], dtype=cos.dtype))


@operator(
    domain="metric-learning",
    tags=("view", "adv-index", "inplace"),
    reference="Wang et al., CosFace: Large Margin Cosine Loss for Deep Face Recognition, CVPR 2018",
    inputs=_face_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_cosface_logits_jax,
)
def cosface_logits(emb, weight, labels, s=64.0, m=0.35):
    """Scaled cosine logits with an additive margin m subtracted at the target class."""
    cos = F.normalize(emb) @ F.normalize(weight).t()
    margin = torch.zeros_like(cos)
    margin[torch.arange(cos.shape[0]), labels] = m
    return s * (cos - margin)


def _circle_loss_jax(emb, labels, m=0.25, gamma=64.0):
    import jax
    import jax.numpy as jnp

    x = emb / jnp.maximum(jnp.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    sim = x @ x.T
    n = emb.shape[0]
    upper = jnp.triu(jnp.ones((n, n), dtype=bool), 1)
    same = labels[:, None] == labels[None, :]
    pos = same & upper
    neg = ~same & upper
    ap = jax.lax.stop_gradient(jnp.maximum(1 + m - sim, 0))
    an = jax.lax.stop_gradient(jnp.maximum(sim + m, 0))
    logit_p = jnp.where(pos, -ap * (sim - (1 - m)) * gamma, -jnp.inf)
    logit_n = jnp.where(neg, an * (sim - m) * gamma, -jnp.inf)
    lse_p = jax.nn.logsumexp(logit_p.reshape(-1))
    lse_n = jax.nn.logsumexp(logit_n.reshape(-1))
    return jax.nn.softplus(lse_p + lse_n)


@operator(
    domain="metric-learning",
    tags=("view", "reduction", "adv-index", "input-dependent", "broadcast"),
    reference="Sun et al., Circle Loss: A Unified Perspective of Pair Similarity Optimization, CVPR 2020",
    inputs=_pk_batch_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_circle_loss_jax,
)
def circle_loss(emb, labels, m=0.25, gamma=64.0):
    """Circle loss over the batch's pairs, with self-paced weights on each similarity."""
    x = F.normalize(emb, dim=1)
    sim = x @ x.T
    upper = torch.ones_like(sim, dtype=torch.bool).triu(diagonal=1)
    same = labels[:, None] == labels[None, :]
    pos_mask = same & upper
    neg_mask = ~same & upper
    sp = sim[pos_mask]
    sn = sim[neg_mask]
    ap = (1 + m - sp.detach()).clamp(min=0)
    an = (sn.detach() + m).clamp(min=0)
    logit_p = -ap * (sp - (1 - m)) * gamma
    logit_n = an * (sn - m) * gamma
    return F.softplus(torch.logsumexp(logit_n, dim=0) + torch.logsumexp(logit_p, dim=0))


# ----------------------------------------------------------------------------------------------
# Contrastive self-supervised losses
# ----------------------------------------------------------------------------------------------


def _supcon_loss_jax(features, labels, temperature=0.07, base_temperature=0.07):
    import jax
    import jax.numpy as jnp

    n, views, _ = features.shape
    contrast = jnp.concatenate([features[:, v] for v in range(views)], axis=0)
    all_labels = jnp.tile(labels, views)
    logits = contrast @ contrast.T / temperature
    logits = logits - jax.lax.stop_gradient(logits.max(1, keepdims=True))
    not_self = 1.0 - jnp.eye(n * views, dtype=logits.dtype)
    pos = (all_labels[:, None] == all_labels[None, :]).astype(logits.dtype) * not_self
    log_prob = logits - jnp.log((jnp.exp(logits) * not_self).sum(1, keepdims=True))
    mean_log_prob_pos = (pos * log_prob).sum(1) / pos.sum(1)
    return (-(temperature / base_temperature) * mean_log_prob_pos).mean()


@operator(
    domain="metric-learning",
    tags=("view", "reduction", "adv-index", "broadcast"),
    reference="Khosla et al., Supervised Contrastive Learning, NeurIPS 2020",
    inputs=_supcon_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_supcon_loss_jax,
)
def supcon_loss(features, labels, temperature=0.07, base_temperature=0.07):
    """SupCon: every view is an anchor; all other views of the same label are its positives."""
    n, views = features.shape[0], features.shape[1]
    labels = labels.contiguous().view(-1, 1)
    mask = torch.eq(labels, labels.T).to(features.dtype)
    contrast = torch.cat(torch.unbind(features, dim=1), dim=0)
    logits = contrast @ contrast.T / temperature
    logits_max, _ = logits.max(dim=1, keepdim=True)
    logits = logits - logits_max.detach()
    mask = mask.repeat(views, views)
    # remove self-contrast: zero the diagonal of the (n*views)^2 matrix
    self_index = torch.arange(n * views).view(-1, 1)
    logits_mask = torch.scatter(torch.ones_like(mask), 1, self_index, 0)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)
    loss = -(temperature / base_temperature) * mean_log_prob_pos
    return loss.view(views, n).mean()


def _infonce_loss_jax(q, k, queue, temperature=0.07):
    import jax
    import jax.numpy as jnp

    def normalize(x):
        return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    q = normalize(q)
    k = jax.lax.stop_gradient(normalize(k))
    l_pos = (q * k).sum(1, keepdims=True)
    l_neg = q @ queue.T
    logits = jnp.concatenate([l_pos, l_neg], axis=1) / temperature
    return -jax.nn.log_softmax(logits, axis=1)[:, 0].mean()


@operator(
    domain="metric-learning",
    tags=("view", "reduction", "container"),
    reference="van den Oord et al., CPC (InfoNCE), 2018; queue of negatives as in He et al., MoCo, CVPR 2020",
    inputs=_infonce_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_infonce_loss_jax,
)
def infonce_loss(q, k, queue, temperature=0.07):
    """InfoNCE: the positive key must win a softmax against the queued negatives (keys get no gradient)."""
    q = F.normalize(q, dim=1)
    k = F.normalize(k, dim=1).detach()
    l_pos = (q * k).sum(dim=1, keepdim=True)
    l_neg = q @ queue.t()
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    targets = torch.zeros(logits.shape[0], dtype=torch.long)
    return F.cross_entropy(logits, targets)
