"""Detection, segmentation and classification losses as their papers and libraries write them.

Each loss is an eager PyTorch function in the style of its reference code (mmdetection-like
weighting and reduction branches, per-bin loops for GHM, per-image / per-class loops for
Lovász), plus a ``jax.numpy`` twin where the loss has a jit-friendly form.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tailjit.bench.registry import operator

# ----------------------------------------------------------------------------------------------
# Input generators (all randomness from the torch.Generator, so a seed fixes the inputs)
# ----------------------------------------------------------------------------------------------


def _dense_cls_inputs(size, gen):
    """Per-anchor class logits and labels in [0, C], where C is background (a RetinaNet head)."""
    n, c = (2000, 80) if size == "small" else (100_000, 80)
    logits = torch.randn(n, c, generator=gen) * 2.0
    labels = torch.randint(0, c, (n,), generator=gen)
    background = torch.rand(n, generator=gen) < 0.9
    labels = torch.where(background, torch.full_like(labels, c), labels)
    return logits, labels


def _softmax_cls_inputs(size, gen):
    """Classification logits and class indices (one image batch / a large token batch)."""
    n, c = (256, 1000) if size == "small" else (4096, 4096)
    return torch.randn(n, c, generator=gen) * 3.0, torch.randint(0, c, (n,), generator=gen)


def _ghmc_inputs(size, gen):
    n, c = (2000, 80) if size == "small" else (100_000, 80)
    logits = torch.randn(n, c, generator=gen) * 2.0
    target = (torch.rand(n, c, generator=gen) < 0.02).float()
    label_weight = (torch.rand(n, 1, generator=gen) < 0.95).float().expand(n, c).contiguous()
    return logits, target, label_weight


def _box_reg_inputs(size, gen):
    """Regression deltas, their targets and per-coordinate weights (positive anchors only weighted)."""
    n = 1000 if size == "small" else 500_000
    pred = torch.randn(n, 4, generator=gen) * 0.5
    target = pred + torch.randn(n, 4, generator=gen) * 0.3
    weight = (torch.rand(n, 1, generator=gen) < 0.3).float().expand(n, 4).contiguous()
    return pred, target, weight


def _iou_aware_inputs(size, gen):
    """Logits and IoU-aware soft targets: zero for negatives, the IoU at the gt class for positives."""
    n, c = (2000, 80) if size == "small" else (100_000, 80)
    logits = torch.randn(n, c, generator=gen) * 2.0
    labels = torch.randint(0, c, (n,), generator=gen)
    positive = torch.rand(n, generator=gen) < 0.1
    iou = torch.rand(n, generator=gen) * 0.9 + 0.05
    target = torch.zeros(n, c)
    target[torch.arange(n), labels] = torch.where(positive, iou, torch.zeros_like(iou))
    return logits, target


def _qfl_inputs(size, gen):
    logits, labels = _dense_cls_inputs(size, gen)
    score = torch.rand(logits.shape[0], generator=gen) * 0.9 + 0.05
    return logits, labels, score


def _dfl_inputs(size, gen):
    """GFL regression head output: per box, 4 sides x (reg_max + 1) bins; targets in [0, reg_max)."""
    n, reg_max = (1000, 16) if size == "small" else (100_000, 16)
    pred = torch.randn(n, 4 * (reg_max + 1), generator=gen)
    target = torch.rand(n, 4, generator=gen) * (reg_max - 0.01)
    return pred, target


def _boxes(n, gen):
    xy = torch.rand(n, 2, generator=gen) * 500
    wh = torch.rand(n, 2, generator=gen) * 100 + 4
    return torch.cat((xy, xy + wh), dim=1)


def _giou_inputs(size, gen):
    n = 1000 if size == "small" else 200_000
    target = _boxes(n, gen)
    pred = target + torch.randn(n, 4, generator=gen) * 8
    pred = torch.cat((pred[:, :2], torch.maximum(pred[:, 2:], pred[:, :2] + 1)), dim=1)
    weight = (torch.rand(n, generator=gen) < 0.5).float()
    return pred, target, weight


def _seg_multiclass_inputs(size, gen):
    b, c, h, w = (8, 21, 64, 64) if size == "small" else (8, 21, 256, 256)
    return torch.randn(b, c, h, w, generator=gen), torch.randint(0, c, (b, h, w), generator=gen)


def _seg_binary_inputs(size, gen):
    b, h, w = (8, 64, 64) if size == "small" else (32, 256, 256)
    logits = torch.randn(b, 1, h, w, generator=gen) * 2.0
    target = (torch.rand(b, 1, h, w, generator=gen) < 0.3).float()
    return logits, target


def _lovasz_hinge_inputs(size, gen):
    logits, target = _seg_binary_inputs(size, gen)
    return logits[:, 0], target[:, 0]


def _lovasz_softmax_inputs(size, gen):
    b, c, h, w = (8, 21, 64, 64) if size == "small" else (4, 21, 256, 256)
    logits = torch.randn(b, c, h, w, generator=gen)
    labels = torch.randint(0, c - 4, (b, h, w), generator=gen)  # some classes absent from the batch
    labels = torch.where(torch.rand(b, h, w, generator=gen) < 0.05, torch.full_like(labels, 255), labels)
    return logits, labels


def _kd_inputs(size, gen):
    student, labels = _softmax_cls_inputs(size, gen)
    teacher = student + torch.randn(student.shape, generator=gen)
    return student, teacher, labels


def _multilabel_inputs(size, gen):
    """Multi-label logits and multi-hot targets (COCO-like at small, OpenImages-like at large)."""
    n, c = (32, 80) if size == "small" else (512, 9605)
    logits = torch.randn(n, c, generator=gen) * 2.0
    targets = (torch.rand(n, c, generator=gen) < 0.05).float()
    return logits, targets


def _seq_inputs(size, gen):
    b, t, v = (32, 50, 1000) if size == "small" else (64, 100, 5000)
    logits = torch.randn(b, t, v, generator=gen)
    targets = torch.randint(0, v, (b, t), generator=gen)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    return logits, targets, lengths


# ----------------------------------------------------------------------------------------------
# Focal-style classification losses
# ----------------------------------------------------------------------------------------------


def _sigmoid_focal_loss_jax(logits, labels, alpha=0.25, gamma=2.0):
    import jax
    import jax.numpy as jnp

    c = logits.shape[1]
    t = jax.nn.one_hot(labels, c + 1, dtype=logits.dtype)[:, :c]
    p = jax.nn.sigmoid(logits)
    pt = (1 - p) * t + p * (1 - t)
    weight = (alpha * t + (1 - alpha) * (1 - t)) * pt**gamma
    bce = jnp.maximum(logits, 0) - logits * t + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    num_pos = jnp.maximum((labels < c).sum(), 1)
    return (bce * weight).sum() / num_pos


@operator(
    domain="loss",
    tags=("view", "reduction"),
    reference="Lin et al., Focal Loss for Dense Object Detection (RetinaNet), ICCV 2017",
    inputs=_dense_cls_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_sigmoid_focal_loss_jax,
)
def sigmoid_focal_loss(logits, labels, alpha=0.25, gamma=2.0):
    """Per-class sigmoid focal loss over all anchors, normalised by the number of positives."""
    num_classes = logits.size(1)
    # label == num_classes is background: its one-hot row is all zeros after dropping that column
    target = F.one_hot(labels, num_classes + 1)[:, :num_classes].to(logits.dtype)
    prob = logits.sigmoid()
    pt = (1 - prob) * target + prob * (1 - target)
    focal_weight = (alpha * target + (1 - alpha) * (1 - target)) * pt.pow(gamma)
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none") * focal_weight
    num_pos = (labels < num_classes).sum().clamp(min=1)
    return loss.sum() / num_pos


def _softmax_focal_loss_jax(logits, labels, gamma=2.0):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=1)
    logpt = jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return (-((1 - jnp.exp(logpt)) ** gamma) * logpt).mean()


@operator(
    domain="loss",
    tags=("view", "reduction", "adv-index", "broadcast"),
    reference="Lin et al., Focal Loss for Dense Object Detection, ICCV 2017 (softmax variant, Sec. 5)",
    inputs=_softmax_cls_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_softmax_focal_loss_jax,
)
def softmax_focal_loss(logits, labels, gamma=2.0):
    """Multi-class focal loss: cross-entropy down-weighted by (1 - p_t)^gamma."""
    logp = F.log_softmax(logits, dim=1)
    logpt = logp.gather(1, labels.unsqueeze(1)).squeeze(1)
    pt = logpt.exp()
    return (-((1 - pt) ** gamma) * logpt).mean()


def _ghm_weights(g, valid, bins):
    """Gradient-density weights: each valid sample gets total / (count in its bin), averaged over bins."""
    edges = torch.arange(bins + 1, dtype=g.dtype) / bins
    edges[-1] += 1e-6
    weights = torch.zeros_like(g)
    total = max(valid.float().sum().item(), 1.0)
    nonempty = 0
    for i in range(bins):
        in_bin = (g >= edges[i]) & (g < edges[i + 1]) & valid
        count = in_bin.sum().item()
        if count > 0:
            weights[in_bin] = total / count
            nonempty += 1
    if nonempty > 0:
        weights = weights / nonempty
    return weights, total


@operator(
    domain="loss",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "inplace"),
    reference="Li et al., Gradient Harmonized Single-stage Detector (GHM-C), AAAI 2019",
    inputs=_ghmc_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def ghm_c_loss(logits, target, label_weight, bins=10):
    """GHM-C: binary cross-entropy re-weighted by the inverse density of the gradient norm |p - y|."""
    g = (logits.sigmoid().detach() - target).abs()
    weights, total = _ghm_weights(g, label_weight > 0, bins)
    return F.binary_cross_entropy_with_logits(logits, target, weights, reduction="sum") / total


@operator(
    domain="loss",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "inplace"),
    reference="Li et al., Gradient Harmonized Single-stage Detector (GHM-R, ASL1 loss), AAAI 2019",
    inputs=_box_reg_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def ghm_r_loss(pred, target, label_weight, mu=0.02, bins=10):
    """GHM-R: authentic smooth L1 (sqrt(d^2 + mu^2) - mu) re-weighted by gradient density."""
    diff = pred - target
    loss = torch.sqrt(diff * diff + mu * mu) - mu
    g = (diff / torch.sqrt(mu * mu + diff * diff)).abs().detach()
    weights, total = _ghm_weights(g, label_weight > 0, bins)
    return (loss * weights).sum() / total


def _varifocal_loss_jax(logits, target, alpha=0.75, gamma=2.0):
    import jax
    import jax.numpy as jnp

    prob = jax.nn.sigmoid(logits)
    pos = (target > 0).astype(logits.dtype)
    weight = target * pos + alpha * jnp.abs(prob - target) ** gamma * (1 - pos)
    bce = jnp.maximum(logits, 0) - logits * target + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    num_pos = jnp.maximum((target > 0).sum(), 1)
    return (bce * weight).sum() / num_pos


@operator(
    domain="loss",
    tags=("reduction",),
    reference="Zhang et al., VarifocalNet: An IoU-aware Dense Object Detector, CVPR 2021",
    inputs=_iou_aware_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_varifocal_loss_jax,
)
def varifocal_loss(logits, target, alpha=0.75, gamma=2.0):
    """Varifocal loss: positives weighted by their IoU target, negatives by alpha * |p - q|^gamma."""
    prob = logits.sigmoid()
    pos = (target > 0).to(logits.dtype)
    focal_weight = target * pos + alpha * (prob - target).abs().pow(gamma) * (1 - pos)
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none") * focal_weight
    return loss.sum() / (target > 0).sum().clamp(min=1)


@operator(
    domain="loss",
    tags=("view", "reduction", "adv-index", "input-dependent", "inplace"),
    reference="Li et al., Generalized Focal Loss (Quality Focal Loss), NeurIPS 2020",
    inputs=_qfl_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def quality_focal_loss(logits, labels, score, beta=2.0):
    """QFL: negatives pushed to 0 and positives to their IoU score, both scaled by |sigma - y|^beta."""
    num_classes = logits.size(1)
    prob = logits.sigmoid()
    zero = torch.zeros_like(logits)
    loss = F.binary_cross_entropy_with_logits(logits, zero, reduction="none") * prob.pow(beta)
    pos = ((labels >= 0) & (labels < num_classes)).nonzero().squeeze(1)
    pos_label = labels[pos]
    scale = score[pos] - prob[pos, pos_label]
    loss[pos, pos_label] = F.binary_cross_entropy_with_logits(
        logits[pos, pos_label], score[pos], reduction="none"
    ) * scale.abs().pow(beta)
    return loss.sum(dim=1).mean()


def _distribution_focal_loss_jax(pred, target):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(pred.reshape(-1, pred.shape[1] // 4), axis=1)
    label = target.reshape(-1)
    left = label.astype(jnp.int32)
    w_left = (left + 1).astype(pred.dtype) - label
    w_right = label - left.astype(pred.dtype)
    lp_left = jnp.take_along_axis(logp, left[:, None], axis=1)[:, 0]
    lp_right = jnp.take_along_axis(logp, left[:, None] + 1, axis=1)[:, 0]
    return (-lp_left * w_left - lp_right * w_right).mean()


@operator(
    domain="loss",
    tags=("view", "reduction"),
    reference="Li et al., Generalized Focal Loss (Distribution Focal Loss), NeurIPS 2020",
    inputs=_dfl_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_distribution_focal_loss_jax,
)
def distribution_focal_loss(pred, target):
    """DFL: cross-entropy on the two integer bins around a continuous distance, linearly weighted."""
    pred = pred.reshape(-1, pred.shape[1] // 4)
    label = target.reshape(-1)
    dis_left = label.long()
    dis_right = dis_left + 1
    weight_left = dis_right.to(pred.dtype) - label
    weight_right = label - dis_left.to(pred.dtype)
    loss = (
        F.cross_entropy(pred, dis_left, reduction="none") * weight_left
        + F.cross_entropy(pred, dis_right, reduction="none") * weight_right
    )
    return loss.mean()


# ----------------------------------------------------------------------------------------------
# Box regression losses
# ----------------------------------------------------------------------------------------------


def _balanced_l1_loss_jax(pred, target, weight, alpha=0.5, gamma=1.5, beta=1.0):
    import jax.numpy as jnp

    diff = jnp.abs(pred - target)
    b = math.exp(gamma / alpha) - 1
    loss = jnp.where(
        diff < beta,
        alpha / b * (b * diff + 1) * jnp.log(b * diff / beta + 1) - alpha * diff,
        gamma * diff + gamma / b - alpha * beta,
    )
    return (loss * weight).sum() / jnp.maximum(weight.sum(), 1.0)


@operator(
    domain="loss",
    tags=("reduction",),
    reference="Pang et al., Libra R-CNN: Towards Balanced Learning for Object Detection, CVPR 2019",
    inputs=_box_reg_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_balanced_l1_loss_jax,
)
def balanced_l1_loss(pred, target, weight, alpha=0.5, gamma=1.5, beta=1.0):
    """Balanced L1: promotes the gradient of inliers (|d| < beta) with a logarithmic branch."""
    diff = (pred - target).abs()
    b = math.exp(gamma / alpha) - 1
    loss = torch.where(
        diff < beta,
        alpha / b * (b * diff + 1) * torch.log(b * diff / beta + 1) - alpha * diff,
        gamma * diff + gamma / b - alpha * beta,
    )
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)


def _smooth_l1_loss_jax(pred, target, weight, beta=1.0 / 9):
    import jax.numpy as jnp

    diff = jnp.abs(pred - target)
    loss = jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)
    return (loss * weight).sum() / jnp.maximum(weight.sum(), 1.0)


@operator(
    domain="loss",
    tags=("reduction", "branch"),
    reference="Girshick, Fast R-CNN, ICCV 2015 (beta = 1/9 as in the Detectron RPN)",
    inputs=_box_reg_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_smooth_l1_loss_jax,
)
def smooth_l1_loss(pred, target, weight, beta=1.0 / 9):
    """Smooth L1 (Huber with slope 1): quadratic below beta, linear above; plain L1 when beta ~ 0."""
    diff = (pred - target).abs()
    if beta < 1e-5:
        loss = diff
    else:
        loss = torch.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)


def _reduce_loss(loss, reduction):
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    return loss.sum()


def _weight_reduce_loss(loss, weight=None, reduction="mean", avg_factor=None):
    """mmdetection's element weighting + reduction, with an optional explicit normaliser."""
    if weight is not None:
        loss = loss * weight
    if avg_factor is None:
        return _reduce_loss(loss, reduction)
    if reduction == "mean":
        return loss.sum() / (avg_factor + torch.finfo(torch.float32).eps)
    if reduction != "none":
        raise ValueError('avg_factor can not be used with reduction="sum"')
    return loss


def _giou(pred, target, eps):
    """Generalized IoU of aligned box pairs (x1, y1, x2, y2)."""
    area_p = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    area_t = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    union = area_p + area_t - overlap + eps
    enclose_lt = torch.min(pred[:, :2], target[:, :2])
    enclose_rb = torch.max(pred[:, 2:], target[:, 2:])
    enclose_wh = (enclose_rb - enclose_lt).clamp(min=0)
    enclose_area = enclose_wh[:, 0] * enclose_wh[:, 1] + eps
    return overlap / union - (enclose_area - union) / enclose_area


@operator(
    domain="loss",
    tags=("view", "reduction", "branch", "broadcast"),
    reference="Rezatofighi et al., Generalized IoU, CVPR 2019; weighting/reduction as in mmdetection",
    inputs=_giou_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def weighted_giou_loss(pred, target, weight, eps=1e-7, reduction="mean", avg_factor=None):
    """1 - GIoU with mmdetection's wrapper: all-zero weights short-circuit, per-coordinate weights average."""
    if weight is not None and not torch.any(weight > 0):
        if pred.dim() == weight.dim() + 1:
            weight = weight.unsqueeze(1)
        return (pred * weight).sum()
    if weight is not None and weight.dim() > 1:
        weight = weight.mean(-1)
    loss = 1 - _giou(pred, target, eps)
    return _weight_reduce_loss(loss, weight, reduction, avg_factor)


# ----------------------------------------------------------------------------------------------
# Segmentation losses
# ----------------------------------------------------------------------------------------------


def _dice_loss_jax(logits, labels, smooth=1.0):
    import jax
    import jax.numpy as jnp

    probs = jax.nn.softmax(logits, axis=1)
    one_hot = jnp.transpose(jax.nn.one_hot(labels, logits.shape[1], dtype=logits.dtype), (0, 3, 1, 2))
    inter = (probs * one_hot).sum(axis=(0, 2, 3))
    card = probs.sum(axis=(0, 2, 3)) + one_hot.sum(axis=(0, 2, 3))
    return 1 - ((2 * inter + smooth) / (card + smooth)).mean()


@operator(
    domain="loss",
    tags=("view", "reduction"),
    reference="Milletari et al., V-Net (soft Dice loss), 3DV 2016; multi-class soft Dice",
    inputs=_seg_multiclass_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_dice_loss_jax,
)
def dice_loss(logits, labels, smooth=1.0):
    """Multi-class soft Dice over the batch, averaged over classes."""
    num_classes = logits.shape[1]
    probs = logits.softmax(dim=1)
    one_hot = F.one_hot(labels, num_classes).permute(0, 3, 1, 2).to(probs.dtype)
    dims = (0, 2, 3)
    inter = (probs * one_hot).sum(dims)
    card = probs.sum(dims) + one_hot.sum(dims)
    dice = (2 * inter + smooth) / (card + smooth)
    return 1 - dice.mean()


def _tversky_loss_jax(logits, target, alpha=0.3, beta=0.7, smooth=1.0):
    import jax
    import jax.numpy as jnp

    p = jax.nn.sigmoid(logits).reshape(logits.shape[0], -1)
    t = target.reshape(target.shape[0], -1)
    tp = (p * t).sum(1)
    fp = (p * (1 - t)).sum(1)
    fn = ((1 - p) * t).sum(1)
    return jnp.mean(1 - (tp + smooth) / (tp + alpha * fp + beta * fn + smooth))


@operator(
    domain="loss",
    tags=("view", "reduction"),
    reference="Salehi et al., Tversky loss function for image segmentation, MLMI 2017",
    inputs=_seg_binary_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_tversky_loss_jax,
)
def tversky_loss(logits, target, alpha=0.3, beta=0.7, smooth=1.0):
    """Per-image binary Tversky loss: Dice with separate false-positive / false-negative weights."""
    p = logits.sigmoid().flatten(1)
    t = target.flatten(1)
    tp = (p * t).sum(1)
    fp = (p * (1 - t)).sum(1)
    fn = ((1 - p) * t).sum(1)
    return (1 - (tp + smooth) / (tp + alpha * fp + beta * fn + smooth)).mean()


def _lovasz_grad(gt_sorted):
    """Gradient of the Lovász extension of the Jaccard loss w.r.t. errors sorted in decreasing order."""
    p = len(gt_sorted)
    gts = gt_sorted.sum()
    intersection = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jaccard = 1.0 - intersection / union
    if p > 1:
        jaccard[1:p] = jaccard[1:p] - jaccard[0:-1]
    return jaccard


@operator(
    domain="loss",
    tags=("view", "reduction", "branch", "loop", "adv-index", "container", "inplace"),
    reference="Berman et al., The Lovász-Softmax loss, CVPR 2018 (binary Lovász hinge, per image)",
    inputs=_lovasz_hinge_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def lovasz_hinge(logits, labels):
    """Per-image Lovász hinge: hinge errors sorted, dotted with the Jaccard-extension gradient."""
    losses = []
    for i in range(logits.shape[0]):
        log = logits[i].reshape(-1)
        lab = labels[i].reshape(-1)
        signs = 2.0 * lab - 1.0
        errors = 1.0 - log * signs
        errors_sorted, perm = torch.sort(errors, dim=0, descending=True, stable=True)
        grad = _lovasz_grad(lab[perm])
        losses.append(torch.dot(F.relu(errors_sorted), grad))
    return torch.stack(losses).mean()


@operator(
    domain="loss",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "container", "inplace"),
    reference="Berman et al., The Lovász-Softmax loss, CVPR 2018 (multi-class, present classes only)",
    inputs=_lovasz_softmax_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def lovasz_softmax(logits, labels, ignore_index=255):
    """Lovász-softmax over the pixels of the batch, one sorted error vector per present class."""
    num_classes = logits.shape[1]
    probas = logits.softmax(dim=1).permute(0, 2, 3, 1).reshape(-1, num_classes)
    labels = labels.reshape(-1)
    valid = labels != ignore_index
    probas = probas[valid]
    labels = labels[valid]
    losses = []
    for c in range(num_classes):
        fg = (labels == c).to(probas.dtype)
        if fg.sum() == 0:
            continue
        errors = (fg - probas[:, c]).abs()
        errors_sorted, perm = torch.sort(errors, dim=0, descending=True, stable=True)
        losses.append(torch.dot(errors_sorted, _lovasz_grad(fg[perm])))
    return torch.stack(losses).mean()


# ----------------------------------------------------------------------------------------------
# Classification losses
# ----------------------------------------------------------------------------------------------


def _label_smoothing_ce_jax(logits, labels, smoothing=0.1):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=1)
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return ((1 - smoothing) * nll - smoothing * logp.mean(axis=1)).mean()


@operator(
    domain="loss",
    tags=("view", "reduction", "adv-index", "broadcast"),
    reference="Szegedy et al., Rethinking the Inception Architecture (label smoothing), CVPR 2016",
    inputs=_softmax_cls_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_label_smoothing_ce_jax,
)
def label_smoothing_ce(logits, labels, smoothing=0.1):
    """Cross-entropy against (1 - eps) one-hot + eps uniform targets."""
    logp = logits.log_softmax(dim=1)
    nll = -logp.gather(1, labels.unsqueeze(1)).squeeze(1)
    smooth = -logp.mean(dim=1)
    return ((1 - smoothing) * nll + smoothing * smooth).mean()


def _kd_loss_jax(student, teacher, labels, temperature=4.0, alpha=0.9):
    import jax
    import jax.numpy as jnp

    log_p = jax.nn.log_softmax(student / temperature, axis=1)
    log_q = jax.nn.log_softmax(teacher / temperature, axis=1)
    kl = (jnp.exp(log_q) * (log_q - log_p)).sum() / student.shape[0]
    logp = jax.nn.log_softmax(student, axis=1)
    ce = -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()
    return alpha * temperature * temperature * kl + (1 - alpha) * ce


@operator(
    domain="loss",
    tags=("reduction",),
    reference="Hinton et al., Distilling the Knowledge in a Neural Network, 2015",
    inputs=_kd_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_kd_loss_jax,
)
def kd_loss(student, teacher, labels, temperature=4.0, alpha=0.9):
    """Soft-target KL at temperature T (scaled by T^2) mixed with the hard-label cross-entropy."""
    soft = F.kl_div(
        F.log_softmax(student / temperature, dim=1),
        F.softmax(teacher / temperature, dim=1),
        reduction="batchmean",
    )
    hard = F.cross_entropy(student, labels)
    return alpha * temperature * temperature * soft + (1 - alpha) * hard


def _poly1_loss_jax(logits, labels, epsilon=1.0):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=1)
    ce = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    return (ce + epsilon * (1 - jnp.exp(-ce))).mean()


@operator(
    domain="loss",
    tags=("reduction",),
    reference="Leng et al., PolyLoss: A Polynomial Expansion Perspective of Classification Losses, ICLR 2022",
    inputs=_softmax_cls_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_poly1_loss_jax,
)
def poly1_loss(logits, labels, epsilon=1.0):
    """Poly-1: cross-entropy plus epsilon times the first polynomial term (1 - p_t)."""
    ce = F.cross_entropy(logits, labels, reduction="none")
    pt = torch.exp(-ce)
    return (ce + epsilon * (1 - pt)).mean()


def _asymmetric_loss_jax(logits, targets, gamma_neg=4.0, gamma_pos=1.0, clip=0.05, eps=1e-8):
    import jax
    import jax.numpy as jnp

    xs_pos = jax.nn.sigmoid(logits)
    xs_neg = 1 - xs_pos
    if clip > 0:
        xs_neg = jnp.minimum(xs_neg + clip, 1.0)
    loss = targets * jnp.log(jnp.maximum(xs_pos, eps)) + (1 - targets) * jnp.log(jnp.maximum(xs_neg, eps))
    pt = xs_pos * targets + xs_neg * (1 - targets)
    gamma = gamma_pos * targets + gamma_neg * (1 - targets)
    return -(loss * (1 - pt) ** gamma).sum()


@operator(
    domain="loss",
    tags=("reduction", "branch"),
    reference="Ridnik et al., Asymmetric Loss For Multi-Label Classification, ICCV 2021",
    inputs=_multilabel_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_asymmetric_loss_jax,
)
def asymmetric_loss(logits, targets, gamma_neg=4.0, gamma_pos=1.0, clip=0.05, eps=1e-8):
    """ASL: separate focusing for positives / negatives plus probability shifting of easy negatives."""
    xs_pos = torch.sigmoid(logits)
    xs_neg = 1 - xs_pos
    if clip is not None and clip > 0:
        xs_neg = (xs_neg + clip).clamp(max=1)
    loss = targets * torch.log(xs_pos.clamp(min=eps)) + (1 - targets) * torch.log(xs_neg.clamp(min=eps))
    if gamma_neg > 0 or gamma_pos > 0:
        pt = xs_pos * targets + xs_neg * (1 - targets)
        gamma = gamma_pos * targets + gamma_neg * (1 - targets)
        loss = loss * torch.pow(1 - pt, gamma)
    return -loss.sum()


def _masked_sequence_ce_jax(logits, targets, lengths):
    import jax
    import jax.numpy as jnp

    b, t, _ = logits.shape
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    mask = (jnp.arange(t)[None, :] < lengths[:, None]).astype(logits.dtype)
    return ((ce * mask).sum(1) / lengths.astype(logits.dtype)).mean()


@operator(
    domain="loss",
    tags=("view", "reduction", "broadcast"),
    reference="Sequence-to-sequence token cross-entropy with length masking (Sutskever et al., 2014)",
    inputs=_seq_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_masked_sequence_ce_jax,
)
def masked_sequence_ce(logits, targets, lengths):
    """Token cross-entropy over padded sequences: masked past each length, averaged per sequence."""
    batch, steps, vocab = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="none").view(batch, steps)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    return ((ce * mask).sum(1) / lengths.to(ce.dtype)).mean()
