"""Non-maximum suppression variants: the sequential loops at the end of every detector.

Boxes are ``(x1, y1, x2, y2)``; the inputs are clustered detections (several
jittered boxes per object) as a detector head produces them.
"""

from __future__ import annotations

import torch

from tailjit.bench.ops.box_coders import jitter_boxes, random_boxes
from tailjit.bench.registry import operator

_IOU_THRESHOLD = 0.5
_SOFT_NMS_SIGMA = 0.5
_MATRIX_NMS_SIGMA = 2.0


def _detections(n, gen, num_classes=1):
    """``n`` detections around ``n // 10`` objects: boxes, scores and (if asked) class labels."""
    objects = random_boxes(max(n // 10, 1), gen)
    owner = torch.randint(0, objects.size(0), (n,), generator=gen)
    boxes = jitter_boxes(objects[owner], gen, scale=0.1)
    scores = torch.rand(n, generator=gen)
    labels = torch.randint(0, num_classes, (n,), generator=gen)
    return boxes, scores, labels


def _nms_inputs(size, gen):
    boxes, scores, _ = _detections(1000 if size == "small" else 5000, gen)
    return boxes, scores


def _iou_one(box, boxes):
    """IoU of one box with each of ``boxes``."""
    xx1 = torch.maximum(box[0], boxes[:, 0])
    yy1 = torch.maximum(box[1], boxes[:, 1])
    xx2 = torch.minimum(box[2], boxes[:, 2])
    yy2 = torch.minimum(box[3], boxes[:, 3])
    inter = (xx2 - xx1).clamp(min=0) * (yy2 - yy1).clamp(min=0)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + areas - inter)


@operator(
    domain="nms",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "container"),
    reference="Greedy NMS (as in Girshick et al. 2014, R-CNN; cf. torchvision.ops.nms)",
    inputs=_nms_inputs,
)
def nms_greedy(boxes, scores):
    """Indices of the kept boxes, by decreasing score: repeatedly keep the best and drop its overlaps."""
    order = scores.argsort(descending=True, stable=True)
    keep = []
    while order.numel() > 0:
        i = order[0]
        keep.append(i)
        if order.numel() == 1:
            break
        rest = order[1:]
        ious = _iou_one(boxes[i], boxes[rest])
        order = rest[ious <= _IOU_THRESHOLD]
    return torch.stack(keep)


def _batched_inputs(size, gen):
    boxes, scores, labels = _detections(1000 if size == "small" else 2000, gen, num_classes=20)
    return boxes, scores, labels


@operator(
    domain="nms",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "container", "broadcast"),
    reference="Class-aware NMS by per-class coordinate offsets, as in torchvision.ops.batched_nms",
    inputs=_batched_inputs,
)
def batched_nms(boxes, scores, labels):
    """Per-class NMS in one pass: shift each class's boxes so that classes never overlap."""
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64)
    max_coordinate = boxes.max()
    offsets = labels.to(boxes) * (max_coordinate + 1)
    boxes_for_nms = boxes + offsets[:, None]
    return nms_greedy(boxes_for_nms, scores)


def _soft_nms_inputs(size, gen):
    boxes, scores, _ = _detections(500 if size == "small" else 1200, gen)
    return boxes, scores


def _soft_nms_jax(boxes, scores):
    import jax
    import jax.numpy as jnp

    n = boxes.shape[0]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])

    def body(i, state):
        s, done, order, out = state
        m = jnp.argmax(jnp.where(done, -jnp.inf, s))
        order = order.at[i].set(m)
        out = out.at[i].set(s[m])
        done = done.at[m].set(True)
        box = boxes[m]
        iw = jnp.clip(jnp.minimum(box[2], boxes[:, 2]) - jnp.maximum(box[0], boxes[:, 0]), 0)
        ih = jnp.clip(jnp.minimum(box[3], boxes[:, 3]) - jnp.maximum(box[1], boxes[:, 1]), 0)
        inter = iw * ih
        ious = inter / (areas[m] + areas - inter)
        s = jnp.where(done, s, s * jnp.exp(-(ious * ious) / _SOFT_NMS_SIGMA))
        return s, done, order, out

    init = (scores, jnp.zeros(n, dtype=bool), jnp.zeros(n, dtype=jnp.int32), jnp.zeros_like(scores))
    _, _, order, out = jax.lax.fori_loop(0, n, body, init)
    return order, out


@operator(
    domain="nms",
    tags=("view", "reduction", "branch", "loop", "adv-index", "container", "inplace"),
    reference="Soft-NMS with a Gaussian penalty (Bodla et al. 2017)",
    inputs=_soft_nms_inputs,
    jax=_soft_nms_jax,
)
def soft_nms(boxes, scores):
    """Visit boxes by decreasing (decayed) score and decay the rest by exp(-IoU^2 / sigma).

    Returns the visiting order (indices into the input) and the decayed score of each visited box.
    """
    boxes = boxes.clone()
    scores = scores.clone()
    n = boxes.size(0)
    inds = torch.arange(n)
    for i in range(n - 1):
        max_pos = i + int(scores[i:].argmax())
        if max_pos != i:
            boxes[[i, max_pos]] = boxes[[max_pos, i]]
            scores[[i, max_pos]] = scores[[max_pos, i]]
            inds[[i, max_pos]] = inds[[max_pos, i]]
        ious = _iou_one(boxes[i], boxes[i + 1 :])
        scores[i + 1 :] *= torch.exp(-(ious * ious) / _SOFT_NMS_SIGMA)
    return inds, scores


def _matrix_nms_inputs(size, gen):
    return _detections(500 if size == "small" else 2000, gen, num_classes=10)


def _matrix_nms_jax(boxes, scores, labels):
    import jax.numpy as jnp

    sort_inds = jnp.argsort(-scores, stable=True)
    boxes, scores, labels = boxes[sort_inds], scores[sort_inds], labels[sort_inds]
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    lt = jnp.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = jnp.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    wh = jnp.clip(rb - lt, 0)
    inter = wh[..., 0] * wh[..., 1]
    iou = jnp.triu(inter / (area[:, None] + area[None, :] - inter), k=1)
    same = jnp.triu((labels[:, None] == labels[None, :]).astype(scores.dtype), k=1)
    decay_iou = iou * same
    compensate = decay_iou.max(axis=0)[:, None]
    decay = jnp.exp(-_MATRIX_NMS_SIGMA * decay_iou**2) / jnp.exp(-_MATRIX_NMS_SIGMA * compensate**2)
    return scores * decay.min(axis=0), sort_inds


@operator(
    domain="nms",
    tags=("view", "reduction", "branch", "adv-index", "broadcast"),
    reference="Matrix NMS of SOLOv2 (Wang et al. 2020), applied to boxes, class-aware",
    inputs=_matrix_nms_inputs,
    jax=_matrix_nms_jax,
)
def matrix_nms(boxes, scores, labels):
    """Decay every score in parallel by its overlaps with higher-scored boxes of the same class."""
    kernel = "gaussian"
    sort_inds = torch.argsort(scores, descending=True, stable=True)
    scores = scores[sort_inds]
    boxes = boxes[sort_inds]
    labels = labels[sort_inds]
    n = boxes.size(0)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    lt = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    iou_matrix = (inter / (area[:, None] + area[None, :] - inter)).triu(diagonal=1)
    labels_x = labels.expand(n, n)
    label_matrix = (labels_x == labels_x.transpose(1, 0)).float().triu(diagonal=1)
    decay_iou = iou_matrix * label_matrix
    compensate_iou, _ = decay_iou.max(0)
    compensate_iou = compensate_iou.expand(n, n).transpose(1, 0)
    if kernel == "gaussian":
        decay_matrix = torch.exp(-1 * _MATRIX_NMS_SIGMA * decay_iou**2)
        compensate_matrix = torch.exp(-1 * _MATRIX_NMS_SIGMA * compensate_iou**2)
        decay_coefficient, _ = (decay_matrix / compensate_matrix).min(0)
    elif kernel == "linear":
        decay_matrix = (1 - decay_iou) / (1 - compensate_iou)
        decay_coefficient, _ = decay_matrix.min(0)
    else:
        raise NotImplementedError(kernel)
    return scores * decay_coefficient, sort_inds


def _diou_one(box, boxes):
    """DIoU of one box with each of ``boxes``: IoU minus normalised squared centre distance."""
    ious = _iou_one(box, boxes)
    cx1, cy1 = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    cx2, cy2 = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    cw = torch.maximum(box[2], boxes[:, 2]) - torch.minimum(box[0], boxes[:, 0])
    ch = torch.maximum(box[3], boxes[:, 3]) - torch.minimum(box[1], boxes[:, 1])
    return ious - ((cx1 - cx2) ** 2 + (cy1 - cy2) ** 2) / (cw**2 + ch**2 + 1e-7)


@operator(
    domain="nms",
    tags=("view", "reduction", "branch", "loop", "adv-index", "inplace"),
    reference="DIoU-NMS (Zheng et al. 2020, AAAI): suppression by Distance-IoU",
    inputs=_nms_inputs,
)
def diou_nms(boxes, scores):
    """Greedy NMS over a keep mask that suppresses by DIoU instead of IoU; returns kept indices."""
    order = scores.argsort(descending=True, stable=True)
    boxes = boxes[order]
    n = boxes.size(0)
    keep = torch.ones(n, dtype=torch.bool)
    for i in range(n):
        if not keep[i]:
            continue
        diou = _diou_one(boxes[i], boxes[i + 1 :])
        keep[i + 1 :] &= diou <= _IOU_THRESHOLD
    return order[keep]
