"""The IoU family: pairwise and aligned overlaps and the IoU-based regression metrics.

Boxes are ``(x1, y1, x2, y2)``.  Aligned metrics compare ``pred[i]`` with
``target[i]``; pairwise ones return an ``(N, M)`` matrix.
"""

from __future__ import annotations

import math

import torch

from tailjit.bench.ops.box_coders import jitter_boxes, random_boxes
from tailjit.bench.registry import operator

_EPS = 1e-6


def _pairwise_inputs(size, gen):
    n, m = (1000, 50) if size == "small" else (100_000, 20)
    return random_boxes(n, gen), random_boxes(m, gen)


def _aligned_inputs(size, gen):
    target = random_boxes(1000 if size == "small" else 200_000, gen)
    return jitter_boxes(target, gen, scale=0.3), target


def _pairwise_iou_jax(boxes1, boxes2):
    import jax.numpy as jnp

    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    lt = jnp.maximum(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = jnp.minimum(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = jnp.clip(rb - lt, 0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / jnp.maximum(area1[:, None] + area2[None, :] - inter, _EPS)


@operator(
    domain="iou",
    tags=("view", "reduction", "broadcast"),
    reference="Pairwise box IoU (Jaccard overlap), as in torchvision.ops.box_iou",
    inputs=_pairwise_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_pairwise_iou_jax,
)
def pairwise_iou(boxes1, boxes2):
    """The (N, M) IoU matrix between two box sets."""
    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[:, :, 0] * wh[:, :, 1]
    union = area1[:, None] + area2[None, :] - inter
    return inter / union.clamp(min=_EPS)


def _aligned_iou_jax(pred, target):
    import jax.numpy as jnp

    lt = jnp.maximum(pred[:, :2], target[:, :2])
    rb = jnp.minimum(pred[:, 2:], target[:, 2:])
    wh = jnp.clip(rb - lt, 0)
    inter = wh[:, 0] * wh[:, 1]
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    at = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    return inter / jnp.maximum(ap + at - inter, _EPS)


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="Element-wise (aligned) IoU of matched boxes, as in mmdet bbox_overlaps(is_aligned=True)",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_aligned_iou_jax,
)
def aligned_iou(pred, target):
    """IoU of pred[i] with target[i]."""
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    area_p = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    area_t = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    union = (area_p + area_t - overlap).clamp(min=_EPS)
    return overlap / union


def _giou_jax(pred, target):
    import jax.numpy as jnp

    iou = _aligned_iou_jax(pred, target)
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    at = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    wh = jnp.clip(jnp.minimum(pred[:, 2:], target[:, 2:]) - jnp.maximum(pred[:, :2], target[:, :2]), 0)
    inter = wh[:, 0] * wh[:, 1]
    union = jnp.maximum(ap + at - inter, _EPS)
    ewh = jnp.clip(jnp.maximum(pred[:, 2:], target[:, 2:]) - jnp.minimum(pred[:, :2], target[:, :2]), 0)
    enclose = jnp.maximum(ewh[:, 0] * ewh[:, 1], _EPS)
    return iou - (enclose - union) / enclose


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="Generalized IoU (Rezatofighi et al. 2019)",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_giou_jax,
)
def giou(pred, target):
    """GIoU: IoU minus the part of the smallest enclosing box that the union does not cover."""
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    ag = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    union = (ap + ag - overlap).clamp(min=_EPS)
    ious = overlap / union
    enclose_x1y1 = torch.min(pred[:, :2], target[:, :2])
    enclose_x2y2 = torch.max(pred[:, 2:], target[:, 2:])
    enclose_wh = (enclose_x2y2 - enclose_x1y1).clamp(min=0)
    enclose_area = (enclose_wh[:, 0] * enclose_wh[:, 1]).clamp(min=_EPS)
    return ious - (enclose_area - union) / enclose_area


def _center_terms_jax(pred, target):
    """IoU, squared centre distance and squared enclosing diagonal (shared by the JAX DIoU family)."""
    import jax.numpy as jnp

    iou = _aligned_iou_jax(pred, target)
    ewh = jnp.clip(jnp.maximum(pred[:, 2:], target[:, 2:]) - jnp.minimum(pred[:, :2], target[:, :2]), 0)
    c2 = ewh[:, 0] ** 2 + ewh[:, 1] ** 2 + _EPS
    rho2 = ((target[:, 0] + target[:, 2]) - (pred[:, 0] + pred[:, 2])) ** 2 / 4 + (
        (target[:, 1] + target[:, 3]) - (pred[:, 1] + pred[:, 3])
    ) ** 2 / 4
    return iou, rho2, c2, ewh


def _diou_jax(pred, target):
    iou, rho2, c2, _ = _center_terms_jax(pred, target)
    return iou - rho2 / c2


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="Distance-IoU (Zheng et al. 2020, AAAI)",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_diou_jax,
)
def diou(pred, target):
    """DIoU: IoU penalised by the squared centre distance over the enclosing diagonal."""
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    ag = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    ious = overlap / (ap + ag - overlap).clamp(min=_EPS)
    enclose_x1y1 = torch.min(pred[:, :2], target[:, :2])
    enclose_x2y2 = torch.max(pred[:, 2:], target[:, 2:])
    enclose_wh = (enclose_x2y2 - enclose_x1y1).clamp(min=0)
    c2 = enclose_wh[:, 0] ** 2 + enclose_wh[:, 1] ** 2 + _EPS
    b1_x1, b1_y1 = pred[:, 0], pred[:, 1]
    b1_x2, b1_y2 = pred[:, 2], pred[:, 3]
    b2_x1, b2_y1 = target[:, 0], target[:, 1]
    b2_x2, b2_y2 = target[:, 2], target[:, 3]
    left = ((b2_x1 + b2_x2) - (b1_x1 + b1_x2)) ** 2 / 4
    right = ((b2_y1 + b2_y2) - (b1_y1 + b1_y2)) ** 2 / 4
    rho2 = left + right
    return ious - rho2 / c2


def _ciou_jax(pred, target):
    import jax
    import jax.numpy as jnp

    iou, rho2, c2, _ = _center_terms_jax(pred, target)
    w1, h1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1] + _EPS
    w2, h2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1] + _EPS
    v = (4 / math.pi**2) * (jnp.arctan(w2 / h2) - jnp.arctan(w1 / h1)) ** 2
    alpha = jax.lax.stop_gradient(v / (1 - iou + v + _EPS))
    return iou - (rho2 / c2 + alpha * v)


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="Complete-IoU (Zheng et al. 2020): DIoU plus an aspect-ratio consistency term",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_ciou_jax,
)
def ciou(pred, target):
    """CIoU: DIoU minus alpha * v, with the trade-off alpha treated as a constant (no gradient)."""
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    ag = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    ious = overlap / (ap + ag - overlap).clamp(min=_EPS)
    enclose_wh = (torch.max(pred[:, 2:], target[:, 2:]) - torch.min(pred[:, :2], target[:, :2])).clamp(min=0)
    c2 = enclose_wh[:, 0] ** 2 + enclose_wh[:, 1] ** 2 + _EPS
    rho2 = ((target[:, 0] + target[:, 2]) - (pred[:, 0] + pred[:, 2])) ** 2 / 4 + (
        (target[:, 1] + target[:, 3]) - (pred[:, 1] + pred[:, 3])
    ) ** 2 / 4
    w1, h1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1] + _EPS
    w2, h2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1] + _EPS
    v = (4 / math.pi**2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (1 - ious + v + _EPS)
    return ious - (rho2 / c2 + alpha * v)


def _eiou_jax(pred, target):
    iou, rho2, c2, ewh = _center_terms_jax(pred, target)
    w1, h1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1]
    w2, h2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    cw2 = ewh[:, 0] ** 2 + _EPS
    ch2 = ewh[:, 1] ** 2 + _EPS
    return 1 - iou + rho2 / c2 + (w1 - w2) ** 2 / cw2 + (h1 - h2) ** 2 / ch2


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="Efficient-IoU loss (Zhang et al. 2022, Neurocomputing): separate width and height penalties",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_eiou_jax,
)
def eiou_loss(pred, target):
    """Per-box EIoU loss: 1 - IoU + centre term + width term + height term."""
    px1, py1, px2, py2 = pred.unbind(-1)
    tx1, ty1, tx2, ty2 = target.unbind(-1)
    iw = (torch.min(px2, tx2) - torch.max(px1, tx1)).clamp(min=0)
    ih = (torch.min(py2, ty2) - torch.max(py1, ty1)).clamp(min=0)
    overlap = iw * ih
    w1, h1 = px2 - px1, py2 - py1
    w2, h2 = tx2 - tx1, ty2 - ty1
    ious = overlap / (w1 * h1 + w2 * h2 - overlap).clamp(min=_EPS)
    cw = (torch.max(px2, tx2) - torch.min(px1, tx1)).clamp(min=0)
    ch = (torch.max(py2, ty2) - torch.min(py1, ty1)).clamp(min=0)
    c2 = cw**2 + ch**2 + _EPS
    rho2 = ((tx1 + tx2) - (px1 + px2)) ** 2 / 4 + ((ty1 + ty2) - (py1 + py2)) ** 2 / 4
    return 1 - ious + rho2 / c2 + (w1 - w2) ** 2 / (cw**2 + _EPS) + (h1 - h2) ** 2 / (ch**2 + _EPS)


def _siou_jax(pred, target):
    import jax.numpy as jnp

    iou = _aligned_iou_jax(pred, target)
    w1, h1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1]
    w2, h2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    cw = jnp.maximum(pred[:, 2], target[:, 2]) - jnp.minimum(pred[:, 0], target[:, 0])
    ch = jnp.maximum(pred[:, 3], target[:, 3]) - jnp.minimum(pred[:, 1], target[:, 1])
    s_cw = (target[:, 0] + target[:, 2] - pred[:, 0] - pred[:, 2]) * 0.5 + _EPS
    s_ch = (target[:, 1] + target[:, 3] - pred[:, 1] - pred[:, 3]) * 0.5 + _EPS
    sigma = jnp.sqrt(s_cw**2 + s_ch**2)
    sin_1 = jnp.clip(jnp.abs(s_cw) / sigma, 0, 1 - _EPS)
    sin_2 = jnp.clip(jnp.abs(s_ch) / sigma, 0, 1 - _EPS)
    sin_alpha = jnp.where(sin_1 > math.sqrt(2) / 2, sin_2, sin_1)
    angle_cost = jnp.cos(jnp.arcsin(sin_alpha) * 2 - math.pi / 2)
    gamma = angle_cost - 2
    distance_cost = 2 - jnp.exp(gamma * (s_cw / cw) ** 2) - jnp.exp(gamma * (s_ch / ch) ** 2)
    omega_w = jnp.abs(w1 - w2) / jnp.maximum(w1, w2)
    omega_h = jnp.abs(h1 - h2) / jnp.maximum(h1, h2)
    shape_cost = (1 - jnp.exp(-omega_w)) ** 4 + (1 - jnp.exp(-omega_h)) ** 4
    return 1 - iou + (distance_cost + shape_cost) / 2


@operator(
    domain="iou",
    tags=("view", "reduction"),
    reference="SIoU loss (Gevorgyan 2022, arXiv:2205.12740): angle, distance and shape costs",
    inputs=_aligned_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_siou_jax,
)
def siou_loss(pred, target):
    """Per-box SIoU loss; the angle cost picks the smaller of the two angles to the axes."""
    w1, h1 = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1]
    w2, h2 = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    iw = (torch.min(pred[:, 2], target[:, 2]) - torch.max(pred[:, 0], target[:, 0])).clamp(min=0)
    ih = (torch.min(pred[:, 3], target[:, 3]) - torch.max(pred[:, 1], target[:, 1])).clamp(min=0)
    inter = iw * ih
    iou = inter / (w1 * h1 + w2 * h2 - inter).clamp(min=_EPS)
    cw = torch.max(pred[:, 2], target[:, 2]) - torch.min(pred[:, 0], target[:, 0])
    ch = torch.max(pred[:, 3], target[:, 3]) - torch.min(pred[:, 1], target[:, 1])
    s_cw = (target[:, 0] + target[:, 2] - pred[:, 0] - pred[:, 2]) * 0.5 + _EPS
    s_ch = (target[:, 1] + target[:, 3] - pred[:, 1] - pred[:, 3]) * 0.5 + _EPS
    sigma = torch.pow(s_cw**2 + s_ch**2, 0.5)
    sin_alpha_1 = (torch.abs(s_cw) / sigma).clamp(max=1 - _EPS)
    sin_alpha_2 = (torch.abs(s_ch) / sigma).clamp(max=1 - _EPS)
    threshold = math.sqrt(2) / 2
    sin_alpha = torch.where(sin_alpha_1 > threshold, sin_alpha_2, sin_alpha_1)
    angle_cost = torch.cos(torch.arcsin(sin_alpha) * 2 - math.pi / 2)
    rho_x = (s_cw / cw) ** 2
    rho_y = (s_ch / ch) ** 2
    gamma = angle_cost - 2
    distance_cost = 2 - torch.exp(gamma * rho_x) - torch.exp(gamma * rho_y)
    omega_w = torch.abs(w1 - w2) / torch.max(w1, w2)
    omega_h = torch.abs(h1 - h2) / torch.max(h1, h2)
    shape_cost = torch.pow(1 - torch.exp(-omega_w), 4) + torch.pow(1 - torch.exp(-omega_h), 4)
    return 1 - iou + 0.5 * (distance_cost + shape_cost)


def _iof_jax(boxes1, boxes2):
    import jax.numpy as jnp

    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    lt = jnp.maximum(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = jnp.minimum(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = jnp.clip(rb - lt, 0)
    return wh[..., 0] * wh[..., 1] / jnp.maximum(area1[:, None], _EPS)


@operator(
    domain="iou",
    tags=("view", "reduction", "broadcast"),
    reference="Intersection over foreground (IoF) for ignore regions, as in mmdet bbox_overlaps(mode='iof')",
    inputs=_pairwise_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_iof_jax,
)
def pairwise_iof(boxes1, boxes2):
    """The (N, M) fraction of each box of ``boxes1`` covered by each box of ``boxes2``."""
    n, m = boxes1.size(0), boxes2.size(0)
    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    lt = torch.max(boxes1[:, :2].unsqueeze(1).expand(n, m, 2), boxes2[:, :2].unsqueeze(0).expand(n, m, 2))
    rb = torch.min(boxes1[:, 2:].unsqueeze(1).expand(n, m, 2), boxes2[:, 2:].unsqueeze(0).expand(n, m, 2))
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    return overlap / area1.unsqueeze(1).clamp(min=_EPS)


def _bbox_overlaps(bboxes1, bboxes2, mode="iou", is_aligned=False):
    """mmdet-style overlaps with a mode switch (iou / iof / giou) and aligned or pairwise layout."""
    assert mode in ("iou", "iof", "giou"), f"unsupported mode {mode}"
    rows, cols = bboxes1.size(0), bboxes2.size(0)
    if is_aligned:
        assert rows == cols
    if rows * cols == 0:
        return bboxes1.new_zeros((rows,) if is_aligned else (rows, cols))
    area1 = (bboxes1[..., 2] - bboxes1[..., 0]) * (bboxes1[..., 3] - bboxes1[..., 1])
    area2 = (bboxes2[..., 2] - bboxes2[..., 0]) * (bboxes2[..., 3] - bboxes2[..., 1])
    if is_aligned:
        lt = torch.max(bboxes1[..., :2], bboxes2[..., :2])
        rb = torch.min(bboxes1[..., 2:], bboxes2[..., 2:])
        wh = (rb - lt).clamp(min=0)
        overlap = wh[..., 0] * wh[..., 1]
        if mode in ("iou", "giou"):
            union = area1 + area2 - overlap
        else:
            union = area1
        if mode == "giou":
            enclosed_lt = torch.min(bboxes1[..., :2], bboxes2[..., :2])
            enclosed_rb = torch.max(bboxes1[..., 2:], bboxes2[..., 2:])
    else:
        lt = torch.max(bboxes1[..., :, None, :2], bboxes2[..., None, :, :2])
        rb = torch.min(bboxes1[..., :, None, 2:], bboxes2[..., None, :, 2:])
        wh = (rb - lt).clamp(min=0)
        overlap = wh[..., 0] * wh[..., 1]
        if mode in ("iou", "giou"):
            union = area1[..., None] + area2[..., None, :] - overlap
        else:
            union = area1[..., None]
        if mode == "giou":
            enclosed_lt = torch.min(bboxes1[..., :, None, :2], bboxes2[..., None, :, :2])
            enclosed_rb = torch.max(bboxes1[..., :, None, 2:], bboxes2[..., None, :, 2:])
    union = torch.max(union, union.new_tensor([_EPS]))
    ious = overlap / union
    if mode in ("iou", "iof"):
        return ious
    enclose_wh = (enclosed_rb - enclosed_lt).clamp(min=0)
    enclose_area = torch.max(enclose_wh[..., 0] * enclose_wh[..., 1], union.new_tensor([_EPS]))
    return ious - (enclose_area - union) / enclose_area


def _overlap_modes_inputs(size, gen):
    n, m = (1000, 20) if size == "small" else (100_000, 10)
    boxes = random_boxes(n, gen)
    return boxes, random_boxes(m, gen), jitter_boxes(boxes, gen, scale=0.3)


@operator(
    domain="iou",
    tags=("view", "reduction", "branch", "container", "broadcast"),
    reference="mmdet bbox_overlaps (mode switch iou/iof/giou, aligned or pairwise), "
    "as used by assigners and IoU losses",
    inputs=_overlap_modes_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def bbox_overlaps_modes(boxes, gts, matched):
    """Pairwise IoU, IoF and GIoU of boxes vs gts, and aligned GIoU of boxes vs their matches."""
    return (
        _bbox_overlaps(boxes, gts, mode="iou"),
        _bbox_overlaps(boxes, gts, mode="iof"),
        _bbox_overlaps(boxes, gts, mode="giou"),
        _bbox_overlaps(boxes, matched, mode="giou", is_aligned=True),
    )
