"""Box coders: the parametrisations detectors regress instead of raw box corners.

Boxes are ``(x1, y1, x2, y2)`` in pixels unless stated otherwise.  The module
also holds the random-box input generators the other detection modules share.
"""

from __future__ import annotations

import math

import torch

from tailjit.bench.registry import operator

#: Faster R-CNN target normalisation (mmdet's DeltaXYWHBBoxCoder defaults for the RCNN head).
_DELTA_MEANS = (0.0, 0.0, 0.0, 0.0)
_DELTA_STDS = (0.1, 0.1, 0.2, 0.2)
#: The decoder clamps dw, dh so that exp() cannot blow a box up by more than 1000/16.
_MAX_RATIO = abs(math.log(16.0 / 1000.0))
#: SSD's centre/size variances.
_SSD_VARIANCES = (0.1, 0.2)
#: TBLR coder normaliser (mmdet's TBLRBBoxCoder default).
_TBLR_NORMALIZER = 4.0
#: YOLOv3 head stride of the decoded level.
_YOLO_STRIDE = 8.0
#: bbox2distance clamps distances to the last bin of GFL's distribution (reg_max = 16).
_MAX_DISTANCE = 16.0
#: Image size (pixels) of the generated boxes.
IMAGE_SIZE = 1024.0


def random_boxes(n: int, gen: torch.Generator, img_size: float = IMAGE_SIZE) -> torch.Tensor:
    """``n`` random xyxy boxes inside a square image, sides between 8 and 256 pixels."""
    wh = 8.0 + 248.0 * torch.rand(n, 2, generator=gen)
    ctr = torch.rand(n, 2, generator=gen) * img_size
    return torch.cat([(ctr - wh / 2).clamp(min=0.0), (ctr + wh / 2).clamp(max=img_size)], dim=1)


def jitter_boxes(boxes: torch.Tensor, gen: torch.Generator, scale: float = 0.1) -> torch.Tensor:
    """Boxes near ``boxes``: centres shifted and sides rescaled by ``scale``-sized noise."""
    wh = boxes[:, 2:] - boxes[:, :2]
    ctr = (boxes[:, :2] + boxes[:, 2:]) / 2 + scale * wh * torch.randn(wh.shape, generator=gen)
    wh = wh * torch.exp(scale * torch.randn(wh.shape, generator=gen))
    return torch.cat([ctr - wh / 2, ctr + wh / 2], dim=1)


def _n_boxes(size: str) -> int:
    return 1000 if size == "small" else 200_000


def _proposal_gt_inputs(size, gen):
    proposals = random_boxes(_n_boxes(size), gen)
    return proposals, jitter_boxes(proposals, gen)


def _decode_inputs(size, gen):
    rois = random_boxes(_n_boxes(size), gen)
    deltas = 0.5 * torch.randn(rois.shape[0], 4, generator=gen)
    img_hw = torch.tensor([IMAGE_SIZE * 0.75, IMAGE_SIZE])
    return rois, deltas, img_hw


def _bbox2delta_jax(proposals, gt):
    import jax.numpy as jnp

    pw, ph = proposals[:, 2] - proposals[:, 0], proposals[:, 3] - proposals[:, 1]
    px, py = proposals[:, 0] + 0.5 * pw, proposals[:, 1] + 0.5 * ph
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gx, gy = gt[:, 0] + 0.5 * gw, gt[:, 1] + 0.5 * gh
    deltas = jnp.stack([(gx - px) / pw, (gy - py) / ph, jnp.log(gw / pw), jnp.log(gh / ph)], axis=-1)
    return (deltas - jnp.asarray(_DELTA_MEANS)) / jnp.asarray(_DELTA_STDS)


@operator(
    domain="box-coder",
    tags=("view", "container", "broadcast", "inplace"),
    reference="Faster R-CNN box parametrisation (Ren et al. 2015), as in mmdet DeltaXYWHBBoxCoder.encode",
    inputs=_proposal_gt_inputs,
    differentiable=True,
    grad_argnums=(0, 1),
    jax=_bbox2delta_jax,
)
def bbox2delta(proposals, gt):
    """Encode ground-truth boxes as normalised (dx, dy, dw, dh) w.r.t. proposals."""
    px = (proposals[..., 0] + proposals[..., 2]) * 0.5
    py = (proposals[..., 1] + proposals[..., 3]) * 0.5
    pw = proposals[..., 2] - proposals[..., 0]
    ph = proposals[..., 3] - proposals[..., 1]
    gx = (gt[..., 0] + gt[..., 2]) * 0.5
    gy = (gt[..., 1] + gt[..., 3]) * 0.5
    gw = gt[..., 2] - gt[..., 0]
    gh = gt[..., 3] - gt[..., 1]
    dx = (gx - px) / pw
    dy = (gy - py) / ph
    dw = torch.log(gw / pw)
    dh = torch.log(gh / ph)
    deltas = torch.stack([dx, dy, dw, dh], dim=-1)
    means = deltas.new_tensor(_DELTA_MEANS).unsqueeze(0)
    stds = deltas.new_tensor(_DELTA_STDS).unsqueeze(0)
    return deltas.sub_(means).div_(stds)


def _delta2bbox_jax(rois, deltas, img_hw):
    import jax.numpy as jnp

    d = deltas * jnp.asarray(_DELTA_STDS * (deltas.shape[1] // 4)) + jnp.asarray(_DELTA_MEANS * (deltas.shape[1] // 4))
    dx, dy = d[:, 0::4], d[:, 1::4]
    dw = jnp.clip(d[:, 2::4], -_MAX_RATIO, _MAX_RATIO)
    dh = jnp.clip(d[:, 3::4], -_MAX_RATIO, _MAX_RATIO)
    px = ((rois[:, 0] + rois[:, 2]) * 0.5)[:, None]
    py = ((rois[:, 1] + rois[:, 3]) * 0.5)[:, None]
    pw = (rois[:, 2] - rois[:, 0])[:, None]
    ph = (rois[:, 3] - rois[:, 1])[:, None]
    gw, gh = pw * jnp.exp(dw), ph * jnp.exp(dh)
    gx, gy = px + pw * dx, py + ph * dy
    x1 = jnp.clip(gx - gw * 0.5, 0, img_hw[1])
    y1 = jnp.clip(gy - gh * 0.5, 0, img_hw[0])
    x2 = jnp.clip(gx + gw * 0.5, 0, img_hw[1])
    y2 = jnp.clip(gy + gh * 0.5, 0, img_hw[0])
    return jnp.stack([x1, y1, x2, y2], axis=-1).reshape(deltas.shape)


@operator(
    domain="box-coder",
    tags=("view", "container", "broadcast"),
    reference="Faster R-CNN box parametrisation (Ren et al. 2015), as in mmdet DeltaXYWHBBoxCoder.decode",
    inputs=_decode_inputs,
    differentiable=True,
    grad_argnums=(1,),
    jax=_delta2bbox_jax,
)
def delta2bbox(rois, deltas, img_hw):
    """Decode (class-specific, 4 columns per class) deltas on rois and clip to the image."""
    num_classes = deltas.size(1) // 4
    means = deltas.new_tensor(_DELTA_MEANS).repeat(1, num_classes)
    stds = deltas.new_tensor(_DELTA_STDS).repeat(1, num_classes)
    denorm = deltas * stds + means
    dx = denorm[:, 0::4]
    dy = denorm[:, 1::4]
    dw = denorm[:, 2::4].clamp(min=-_MAX_RATIO, max=_MAX_RATIO)
    dh = denorm[:, 3::4].clamp(min=-_MAX_RATIO, max=_MAX_RATIO)
    px = ((rois[:, 0] + rois[:, 2]) * 0.5).unsqueeze(1).expand_as(dx)
    py = ((rois[:, 1] + rois[:, 3]) * 0.5).unsqueeze(1).expand_as(dy)
    pw = (rois[:, 2] - rois[:, 0]).unsqueeze(1).expand_as(dw)
    ph = (rois[:, 3] - rois[:, 1]).unsqueeze(1).expand_as(dh)
    gw = pw * dw.exp()
    gh = ph * dh.exp()
    gx = px + pw * dx
    gy = py + ph * dy
    x1 = torch.clamp(gx - gw * 0.5, min=0, max=img_hw[1])
    y1 = torch.clamp(gy - gh * 0.5, min=0, max=img_hw[0])
    x2 = torch.clamp(gx + gw * 0.5, min=0, max=img_hw[1])
    y2 = torch.clamp(gy + gh * 0.5, min=0, max=img_hw[0])
    return torch.stack([x1, y1, x2, y2], dim=-1).view_as(deltas)


def _legacy_delta2bbox_jax(rois, deltas, img_hw):
    import jax.numpy as jnp

    d = deltas * jnp.asarray(_DELTA_STDS) + jnp.asarray(_DELTA_MEANS)
    dw = jnp.clip(d[:, 2], -_MAX_RATIO, _MAX_RATIO)
    dh = jnp.clip(d[:, 3], -_MAX_RATIO, _MAX_RATIO)
    pw = rois[:, 2] - rois[:, 0] + 1.0
    ph = rois[:, 3] - rois[:, 1] + 1.0
    px = (rois[:, 0] + rois[:, 2]) * 0.5
    py = (rois[:, 1] + rois[:, 3]) * 0.5
    gw, gh = pw * jnp.exp(dw), ph * jnp.exp(dh)
    gx, gy = px + pw * d[:, 0], py + ph * d[:, 1]
    x1 = jnp.clip(gx - gw * 0.5 + 0.5, 0, img_hw[1] - 1)
    y1 = jnp.clip(gy - gh * 0.5 + 0.5, 0, img_hw[0] - 1)
    x2 = jnp.clip(gx + gw * 0.5 - 0.5, 0, img_hw[1] - 1)
    y2 = jnp.clip(gy + gh * 0.5 - 0.5, 0, img_hw[0] - 1)
    return jnp.stack([x1, y1, x2, y2], axis=-1)


@operator(
    domain="box-coder",
    tags=("view", "container"),
    reference="Legacy (+1 pixel widths) delta coder of the original Faster R-CNN / Detectron, "
    "as in mmdet LegacyDeltaXYWHBBoxCoder",
    inputs=_decode_inputs,
    differentiable=True,
    grad_argnums=(1,),
    jax=_legacy_delta2bbox_jax,
)
def legacy_delta2bbox(rois, deltas, img_hw):
    """Decode deltas with the legacy integer-pixel convention (width = x2 - x1 + 1)."""
    means = deltas.new_tensor(_DELTA_MEANS)
    stds = deltas.new_tensor(_DELTA_STDS)
    denorm = deltas * stds + means
    dx, dy, dw, dh = denorm.unbind(dim=1)
    dw = dw.clamp(min=-_MAX_RATIO, max=_MAX_RATIO)
    dh = dh.clamp(min=-_MAX_RATIO, max=_MAX_RATIO)
    pw = rois[:, 2] - rois[:, 0] + 1.0
    ph = rois[:, 3] - rois[:, 1] + 1.0
    px = (rois[:, 0] + rois[:, 2]) * 0.5
    py = (rois[:, 1] + rois[:, 3]) * 0.5
    gw = pw * dw.exp()
    gh = ph * dh.exp()
    gx = torch.addcmul(px, pw, dx)
    gy = torch.addcmul(py, ph, dy)
    max_w = img_hw[1] - 1
    max_h = img_hw[0] - 1
    x1 = (gx - gw * 0.5 + 0.5).clamp(min=0, max=max_w)
    y1 = (gy - gh * 0.5 + 0.5).clamp(min=0, max=max_h)
    x2 = (gx + gw * 0.5 - 0.5).clamp(min=0, max=max_w)
    y2 = (gy + gh * 0.5 - 0.5).clamp(min=0, max=max_h)
    return torch.stack([x1, y1, x2, y2], dim=-1)


def _point_distance_inputs(size, gen):
    n = _n_boxes(size)
    points = torch.rand(n, 2, generator=gen) * IMAGE_SIZE
    distances = 64.0 * torch.rand(n, 4, generator=gen)
    img_hw = torch.tensor([IMAGE_SIZE * 0.75, IMAGE_SIZE])
    return points, distances, img_hw


def _distance2bbox_jax(points, distance, img_hw):
    import jax.numpy as jnp

    x1 = jnp.clip(points[:, 0] - distance[:, 0], 0, img_hw[1])
    y1 = jnp.clip(points[:, 1] - distance[:, 1], 0, img_hw[0])
    x2 = jnp.clip(points[:, 0] + distance[:, 2], 0, img_hw[1])
    y2 = jnp.clip(points[:, 1] + distance[:, 3], 0, img_hw[0])
    return jnp.stack([x1, y1, x2, y2], axis=-1)


@operator(
    domain="box-coder",
    tags=("view", "container"),
    reference="FCOS (Tian et al. 2019) distance-to-box decoding, as in mmdet distance2bbox",
    inputs=_point_distance_inputs,
    differentiable=True,
    grad_argnums=(1,),
    jax=_distance2bbox_jax,
)
def distance2bbox(points, distance, img_hw):
    """Turn (left, top, right, bottom) distances from points into boxes clipped to the image."""
    x1 = points[:, 0] - distance[:, 0]
    y1 = points[:, 1] - distance[:, 1]
    x2 = points[:, 0] + distance[:, 2]
    y2 = points[:, 1] + distance[:, 3]
    x1 = x1.clamp(min=0, max=img_hw[1])
    y1 = y1.clamp(min=0, max=img_hw[0])
    x2 = x2.clamp(min=0, max=img_hw[1])
    y2 = y2.clamp(min=0, max=img_hw[0])
    return torch.stack([x1, y1, x2, y2], -1)


def _points_boxes_inputs(size, gen):
    boxes = random_boxes(_n_boxes(size), gen)
    # points inside (mostly) their box, in units of the level stride (GFL regresses in stride units)
    t = torch.rand(boxes.shape[0], 2, generator=gen)
    points = boxes[:, :2] + t * (boxes[:, 2:] - boxes[:, :2])
    stride = 8.0
    return points / stride, boxes / stride


def _bbox2distance_jax(points, bbox):
    import jax.numpy as jnp

    left = points[:, 0] - bbox[:, 0]
    top = points[:, 1] - bbox[:, 1]
    right = bbox[:, 2] - points[:, 0]
    bottom = bbox[:, 3] - points[:, 1]
    return jnp.clip(jnp.stack([left, top, right, bottom], -1), 0, _MAX_DISTANCE - 0.01)


@operator(
    domain="box-coder",
    tags=("view", "container"),
    reference="FCOS / GFL (Li et al. 2020) box-to-distance encoding, as in mmdet bbox2distance",
    inputs=_points_boxes_inputs,
    differentiable=True,
    grad_argnums=(1,),
    jax=_bbox2distance_jax,
)
def bbox2distance(points, bbox):
    """Encode boxes as distances from points to the four sides, clamped to the last GFL bin."""
    left = points[:, 0] - bbox[:, 0]
    top = points[:, 1] - bbox[:, 1]
    right = bbox[:, 2] - points[:, 0]
    bottom = bbox[:, 3] - points[:, 1]
    left = left.clamp(min=0, max=_MAX_DISTANCE - 0.01)
    top = top.clamp(min=0, max=_MAX_DISTANCE - 0.01)
    right = right.clamp(min=0, max=_MAX_DISTANCE - 0.01)
    bottom = bottom.clamp(min=0, max=_MAX_DISTANCE - 0.01)
    return torch.stack([left, top, right, bottom], -1)


def _tblr_inputs(size, gen):
    priors = random_boxes(_n_boxes(size), gen)
    tblr = 0.5 * torch.rand(priors.shape[0], 4, generator=gen)
    img_hw = torch.tensor([IMAGE_SIZE * 0.75, IMAGE_SIZE])
    return priors, tblr, img_hw


def _tblr2bbox_jax(priors, tblr, img_hw):
    import jax.numpy as jnp

    wh = priors[:, 2:4] - priors[:, 0:2]
    ctr = (priors[:, 0:2] + priors[:, 2:4]) / 2
    loc = tblr * _TBLR_NORMALIZER
    top, bottom = loc[:, 0] * wh[:, 1], loc[:, 1] * wh[:, 1]
    left, right = loc[:, 2] * wh[:, 0], loc[:, 3] * wh[:, 0]
    x1 = jnp.clip(ctr[:, 0] - left, 0, img_hw[1])
    x2 = jnp.clip(ctr[:, 0] + right, 0, img_hw[1])
    y1 = jnp.clip(ctr[:, 1] - top, 0, img_hw[0])
    y2 = jnp.clip(ctr[:, 1] + bottom, 0, img_hw[0])
    return jnp.stack([x1, y1, x2, y2], axis=-1)


@operator(
    domain="box-coder",
    tags=("view", "inplace"),
    reference="TBLR (top/bottom/left/right) coder of FSAF (Zhu et al. 2019), as in mmdet TBLRBBoxCoder",
    inputs=_tblr_inputs,
    differentiable=True,
    grad_argnums=(1,),
    jax=_tblr2bbox_jax,
)
def tblr2bbox(priors, tblr, img_hw):
    """Decode normalised distances (top, bottom, left, right) from prior centres into boxes."""
    loc_decode = tblr * _TBLR_NORMALIZER
    prior_centers = (priors[..., 0:2] + priors[..., 2:4]) / 2
    wh = priors[..., 2:4] - priors[..., 0:2]
    loc_decode[..., 0:2] = loc_decode[..., 0:2] * wh[..., 1:2]
    loc_decode[..., 2:4] = loc_decode[..., 2:4] * wh[..., 0:1]
    top, bottom, left, right = loc_decode.split((1, 1, 1, 1), dim=-1)
    xmin = (prior_centers[..., 0:1] - left).clamp(min=0, max=img_hw[1])
    xmax = (prior_centers[..., 0:1] + right).clamp(min=0, max=img_hw[1])
    ymin = (prior_centers[..., 1:2] - top).clamp(min=0, max=img_hw[0])
    ymax = (prior_centers[..., 1:2] + bottom).clamp(min=0, max=img_hw[0])
    return torch.cat((xmin, ymin, xmax, ymax), dim=-1)


_YOLO_ANCHORS = ((10.0, 13.0), (16.0, 30.0), (33.0, 23.0))


def _yolo_inputs(size, gen):
    batch, grid = (8, 13) if size == "small" else (32, 76)
    pred = torch.randn(batch, len(_YOLO_ANCHORS), grid, grid, 4, generator=gen)
    anchors = torch.tensor(_YOLO_ANCHORS)
    return pred, anchors


def _yolo_box_decode_jax(pred, anchors):
    import jax
    import jax.numpy as jnp

    b, a, h, w, _ = pred.shape
    gy, gx = jnp.meshgrid(jnp.arange(h, dtype=pred.dtype), jnp.arange(w, dtype=pred.dtype), indexing="ij")
    cx = (jax.nn.sigmoid(pred[..., 0]) + gx) * _YOLO_STRIDE
    cy = (jax.nn.sigmoid(pred[..., 1]) + gy) * _YOLO_STRIDE
    bw = jnp.exp(pred[..., 2]) * anchors[:, 0].reshape(1, a, 1, 1)
    bh = jnp.exp(pred[..., 3]) * anchors[:, 1].reshape(1, a, 1, 1)
    boxes = jnp.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=-1)
    return boxes.reshape(b, -1, 4)


@operator(
    domain="box-coder",
    tags=("view", "container", "broadcast"),
    reference="YOLOv3 (Redmon & Farhadi 2018) grid-relative sigmoid offsets and anchor-scaled exp sizes",
    inputs=_yolo_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_yolo_box_decode_jax,
)
def yolo_box_decode(pred, anchors):
    """Decode raw (tx, ty, tw, th) of a YOLO head of shape (B, A, H, W, 4) into xyxy boxes."""
    batch, num_anchors, height, width, _ = pred.shape
    grid_y, grid_x = torch.meshgrid(
        torch.arange(height, dtype=pred.dtype), torch.arange(width, dtype=pred.dtype), indexing="ij"
    )
    cx = (pred[..., 0].sigmoid() + grid_x) * _YOLO_STRIDE
    cy = (pred[..., 1].sigmoid() + grid_y) * _YOLO_STRIDE
    anchor_w = anchors[:, 0].view(1, num_anchors, 1, 1)
    anchor_h = anchors[:, 1].view(1, num_anchors, 1, 1)
    bw = pred[..., 2].exp() * anchor_w
    bh = pred[..., 3].exp() * anchor_h
    boxes = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], dim=-1)
    return boxes.reshape(batch, -1, 4)


def _ssd_encode_inputs(size, gen):
    gt = random_boxes(_n_boxes(size), gen, img_size=1.0 * 300) / 300.0
    p = jitter_boxes(gt, gen, scale=0.2)
    priors = torch.cat([(p[:, :2] + p[:, 2:]) / 2, p[:, 2:] - p[:, :2]], dim=1)
    return gt, priors


def _ssd_encode_jax(matched, priors):
    import jax.numpy as jnp

    g_cxcy = ((matched[:, :2] + matched[:, 2:]) / 2 - priors[:, :2]) / (_SSD_VARIANCES[0] * priors[:, 2:])
    g_wh = jnp.log((matched[:, 2:] - matched[:, :2]) / priors[:, 2:]) / _SSD_VARIANCES[1]
    return jnp.concatenate([g_cxcy, g_wh], axis=1)


@operator(
    domain="box-coder",
    tags=("view", "container"),
    reference="SSD (Liu et al. 2016) centre-size encoding with variances",
    inputs=_ssd_encode_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_ssd_encode_jax,
)
def ssd_encode(matched, priors):
    """Encode matched xyxy ground truth against (cx, cy, w, h) priors with SSD's variances."""
    g_cxcy = (matched[:, :2] + matched[:, 2:]) / 2 - priors[:, :2]
    g_cxcy /= _SSD_VARIANCES[0] * priors[:, 2:]
    g_wh = (matched[:, 2:] - matched[:, :2]) / priors[:, 2:]
    g_wh = torch.log(g_wh) / _SSD_VARIANCES[1]
    return torch.cat([g_cxcy, g_wh], 1)


def _flip_merge_inputs(size, gen):
    n = _n_boxes(size)
    base = random_boxes(n, gen)
    views = []
    directions = torch.tensor([0, 1, 2, 3])
    for d in directions.tolist():
        view = jitter_boxes(base, gen, scale=0.05)
        if d in (1, 3):
            view = torch.stack([IMAGE_SIZE - view[:, 2], view[:, 1], IMAGE_SIZE - view[:, 0], view[:, 3]], 1)
        if d in (2, 3):
            view = torch.stack([view[:, 0], IMAGE_SIZE - view[:, 3], view[:, 2], IMAGE_SIZE - view[:, 1]], 1)
        views.append(view)
    img_hw = torch.tensor([IMAGE_SIZE, IMAGE_SIZE])
    return torch.stack(views), directions, img_hw


@operator(
    domain="box-coder",
    tags=("view", "reduction", "branch", "loop", "input-dependent", "container", "inplace"),
    reference="Test-time-augmentation merge of flipped detections, as in mmdet bbox_flip / merge_aug_bboxes",
    inputs=_flip_merge_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def bbox_flip_merge(aug_bboxes, flip_directions, img_hw):
    """Flip each augmented view's boxes back (0 none, 1 horizontal, 2 vertical, 3 diagonal) and average."""
    height, width = img_hw.tolist()
    recovered = []
    for bboxes, direction in zip(aug_bboxes, flip_directions.tolist()):
        flipped = bboxes.clone()
        if direction == 1:
            flipped[:, 0::4] = width - bboxes[:, 2::4]
            flipped[:, 2::4] = width - bboxes[:, 0::4]
        elif direction == 2:
            flipped[:, 1::4] = height - bboxes[:, 3::4]
            flipped[:, 3::4] = height - bboxes[:, 1::4]
        elif direction == 3:
            flipped[:, 0::4] = width - bboxes[:, 2::4]
            flipped[:, 1::4] = height - bboxes[:, 3::4]
            flipped[:, 2::4] = width - bboxes[:, 0::4]
            flipped[:, 3::4] = height - bboxes[:, 1::4]
        recovered.append(flipped)
    return torch.stack(recovered).mean(dim=0)


def _rescale_inputs(size, gen):
    n = _n_boxes(size)
    boxes = random_boxes(n, gen)
    batch_ids = torch.randint(0, 8, (n, 1), generator=gen).float()
    rois = torch.cat([batch_ids, boxes], dim=1)
    scale_factor = torch.tensor([1.2])
    img_hw = torch.tensor([IMAGE_SIZE * 0.75, IMAGE_SIZE])
    return rois, scale_factor, img_hw


@operator(
    domain="box-coder",
    tags=("view", "branch", "container"),
    reference="RoI rescaling around the centre and clipping to the image, as in mmdet bbox_rescale / "
    "clip boxes (used by Cascade/Grid R-CNN)",
    inputs=_rescale_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def bbox_rescale_clip(rois, scale_factor, img_hw):
    """Scale boxes (or rois with a leading batch column) about their centres, then clip to the image."""
    if rois.size(1) == 5:
        bboxes = rois[:, 1:]
        inds = rois[:, 0]
    else:
        bboxes = rois
    cx = (bboxes[:, 0] + bboxes[:, 2]) * 0.5
    cy = (bboxes[:, 1] + bboxes[:, 3]) * 0.5
    w = (bboxes[:, 2] - bboxes[:, 0]) * scale_factor
    h = (bboxes[:, 3] - bboxes[:, 1]) * scale_factor
    x1 = (cx - 0.5 * w).clamp(min=0, max=img_hw[1])
    x2 = (cx + 0.5 * w).clamp(min=0, max=img_hw[1])
    y1 = (cy - 0.5 * h).clamp(min=0, max=img_hw[0])
    y2 = (cy + 0.5 * h).clamp(min=0, max=img_hw[0])
    if rois.size(1) == 5:
        return torch.stack([inds, x1, y1, x2, y2], dim=-1)
    return torch.stack([x1, y1, x2, y2], dim=-1)
