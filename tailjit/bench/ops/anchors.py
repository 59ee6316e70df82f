"""Anchor and prior generators: the dense box/point layouts single-stage detectors regress from.

Feature maps are passed as tensors of shape ``(1, C, H, W)``; like the
detectors' heads, the generators only read their spatial sizes.
"""

from __future__ import annotations

import itertools
import math

import torch

from tailjit.bench.registry import operator

_RETINA_STRIDES = (8, 16, 32)
_FCOS_STRIDES = (8, 16, 32, 64, 128)
_FCOS_RANGES = ((-1.0, 64.0), (64.0, 128.0), (128.0, 256.0), (256.0, 512.0), (512.0, 1e8))
_YOLO_STRIDES = (8, 16, 32)
_YOLO_MASKS = ((0, 1, 2), (3, 4, 5), (6, 7, 8))
#: YOLOv3's COCO anchors (w, h) in pixels.
_YOLO_ANCHORS = (
    (10.0, 13.0),
    (16.0, 30.0),
    (33.0, 23.0),
    (30.0, 61.0),
    (62.0, 45.0),
    (59.0, 119.0),
    (116.0, 90.0),
    (156.0, 198.0),
    (373.0, 326.0),
)
#: SSD300 layout, with sizes as fractions of the image side so that it scales to other images.
_SSD_STEPS = (8, 16, 32, 64, 100, 300)
_SSD_MIN_SIZES = (0.1, 0.2, 0.37, 0.54, 0.71, 0.88)
_SSD_MAX_SIZES = (0.2, 0.37, 0.54, 0.71, 0.88, 1.05)
_SSD_ASPECT_RATIOS = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
_SSD_CLIP = True


def _levels(image_size, strides, gen):
    """One dummy (1, 1, H, W) feature map per stride for a square image of ``image_size`` pixels."""
    return tuple(
        torch.randn(1, 1, math.ceil(image_size / s), math.ceil(image_size / s), generator=gen) for s in strides
    )


def _retina_scales_ratios():
    scales = 4.0 * 2.0 ** (torch.arange(3, dtype=torch.float32) / 3)
    return scales, torch.tensor([0.5, 1.0, 2.0])


def _anchor_grid_inputs(size, gen):
    feats = _levels(160 if size == "small" else 1280, _RETINA_STRIDES, gen)
    return (*feats, *_retina_scales_ratios())


def _base_anchors(base_size, scales, ratios):
    """The A = len(ratios) * len(scales) anchors centred on the origin of one level."""
    h_ratios = torch.sqrt(ratios)
    w_ratios = 1 / h_ratios
    ws = (base_size * w_ratios[:, None] * scales[None, :]).view(-1)
    hs = (base_size * h_ratios[:, None] * scales[None, :]).view(-1)
    return torch.stack([-0.5 * ws, -0.5 * hs, 0.5 * ws, 0.5 * hs], dim=-1)


def _mesh(x, y):
    xx = x.repeat(y.shape[0])
    yy = y.view(-1, 1).repeat(1, x.shape[0]).view(-1)
    return xx, yy


def _anchor_grid_jax(feat_p3, feat_p4, feat_p5, scales, ratios):
    import jax.numpy as jnp

    out = []
    for feat, stride in zip((feat_p3, feat_p4, feat_p5), _RETINA_STRIDES):
        h_ratios = jnp.sqrt(ratios)
        ws = (stride / h_ratios[:, None] * scales[None, :]).reshape(-1)
        hs = (stride * h_ratios[:, None] * scales[None, :]).reshape(-1)
        base = jnp.stack([-0.5 * ws, -0.5 * hs, 0.5 * ws, 0.5 * hs], axis=-1)
        h, w = feat.shape[-2:]
        yy, xx = jnp.meshgrid(jnp.arange(h, dtype=base.dtype), jnp.arange(w, dtype=base.dtype), indexing="ij")
        xx, yy = xx.reshape(-1) * stride, yy.reshape(-1) * stride
        shifts = jnp.stack([xx, yy, xx, yy], axis=-1)
        out.append((base[None] + shifts[:, None]).reshape(-1, 4))
    return jnp.concatenate(out)


@operator(
    domain="anchor",
    tags=("view", "loop", "container", "broadcast"),
    reference="RetinaNet (Lin et al. 2017) multi-level anchors: scales x ratios shifted over the grid, "
    "as in mmdet AnchorGenerator",
    inputs=_anchor_grid_inputs,
    jax=_anchor_grid_jax,
)
def anchor_grid(feat_p3, feat_p4, feat_p5, scales, ratios):
    """All anchors of three pyramid levels, location-major then anchor, concatenated over levels."""
    all_anchors = []
    for feat, stride in zip((feat_p3, feat_p4, feat_p5), _RETINA_STRIDES):
        base_anchors = _base_anchors(stride, scales, ratios)
        feat_h, feat_w = feat.shape[-2:]
        shift_x = torch.arange(0, feat_w, dtype=base_anchors.dtype) * stride
        shift_y = torch.arange(0, feat_h, dtype=base_anchors.dtype) * stride
        shift_xx, shift_yy = _mesh(shift_x, shift_y)
        shifts = torch.stack([shift_xx, shift_yy, shift_xx, shift_yy], dim=-1)
        anchors = base_anchors[None, :, :] + shifts[:, None, :]
        all_anchors.append(anchors.view(-1, 4))
    return torch.cat(all_anchors, dim=0)


def _ssd_inputs(size, gen):
    side = 300 if size == "small" else 1024
    return (torch.randn(1, 3, side, side, generator=gen),)


@operator(
    domain="anchor",
    tags=("view", "branch", "loop", "adv-index", "container", "inplace"),
    reference="SSD (Liu et al. 2016) default boxes: per-level min/max sizes and aspect ratios",
    inputs=_ssd_inputs,
)
def ssd_prior_boxes(image):
    """SSD priors (cx, cy, w, h) in relative coordinates, built location by location in Python."""
    image_size = image.shape[-1]
    mean = []
    for k, step in enumerate(_SSD_STEPS):
        f = math.ceil(image_size / step)
        f_k = image_size / step
        s_k = _SSD_MIN_SIZES[k]
        s_k_prime = math.sqrt(s_k * _SSD_MAX_SIZES[k])
        for i, j in itertools.product(range(f), repeat=2):
            cx = (j + 0.5) / f_k
            cy = (i + 0.5) / f_k
            mean += [cx, cy, s_k, s_k]
            mean += [cx, cy, s_k_prime, s_k_prime]
            for ar in _SSD_ASPECT_RATIOS[k]:
                mean += [cx, cy, s_k * math.sqrt(ar), s_k / math.sqrt(ar)]
                mean += [cx, cy, s_k / math.sqrt(ar), s_k * math.sqrt(ar)]
    output = torch.tensor(mean, dtype=image.dtype).view(-1, 4)
    if _SSD_CLIP:
        output.clamp_(max=1, min=0)
    return output


def _yolo_inputs(size, gen):
    feats = _levels(416 if size == "small" else 1280, _YOLO_STRIDES, gen)
    return (*feats, torch.tensor(_YOLO_ANCHORS))


def _yolo_grid_anchors_jax(feat_s8, feat_s16, feat_s32, anchors):
    import jax.numpy as jnp

    boxes, strides = [], []
    for feat, stride, mask in zip((feat_s8, feat_s16, feat_s32), _YOLO_STRIDES, _YOLO_MASKS):
        h, w = feat.shape[-2:]
        gy, gx = jnp.meshgrid(jnp.arange(h, dtype=anchors.dtype), jnp.arange(w, dtype=anchors.dtype), indexing="ij")
        ctr = (jnp.stack([gx, gy], -1).reshape(-1, 1, 2) + 0.5) * stride
        wh = anchors[mask[0] : mask[-1] + 1]
        ctr = jnp.broadcast_to(ctr, (h * w, len(mask), 2))
        wh = jnp.broadcast_to(wh[None], (h * w, len(mask), 2))
        boxes.append(jnp.concatenate([ctr, wh], -1).reshape(-1, 4))
        strides.append(jnp.full((h * w * len(mask),), float(stride), dtype=anchors.dtype))
    return jnp.concatenate(boxes), jnp.concatenate(strides)


@operator(
    domain="anchor",
    tags=("view", "loop", "adv-index", "container", "broadcast"),
    reference="YOLOv3 (Redmon & Farhadi 2018) grid cells with per-scale anchor masks",
    inputs=_yolo_inputs,
    jax=_yolo_grid_anchors_jax,
)
def yolo_grid_anchors(feat_s8, feat_s16, feat_s32, anchors):
    """(cx, cy, w, h) priors of every grid cell and anchor of the three YOLO scales, plus their strides."""
    boxes = []
    strides = []
    for feat, stride, mask in zip((feat_s8, feat_s16, feat_s32), _YOLO_STRIDES, _YOLO_MASKS):
        h, w = feat.shape[-2:]
        grid_y, grid_x = torch.meshgrid(
            torch.arange(h, dtype=anchors.dtype), torch.arange(w, dtype=anchors.dtype), indexing="ij"
        )
        centers = (torch.stack((grid_x, grid_y), dim=-1).view(-1, 1, 2) + 0.5) * stride
        level_anchors = anchors[list(mask)]
        centers = centers.expand(-1, len(mask), 2)
        sizes = level_anchors.unsqueeze(0).expand(h * w, -1, -1)
        boxes.append(torch.cat((centers, sizes), dim=-1).reshape(-1, 4))
        strides.append(anchors.new_full((h * w * len(mask),), stride))
    return torch.cat(boxes), torch.cat(strides)


def _fcos_inputs(size, gen):
    return _levels(320 if size == "small" else 2400, _FCOS_STRIDES, gen)


def _fcos_points_jax(p3, p4, p5, p6, p7):
    import jax.numpy as jnp

    points, strides, ranges = [], [], []
    for feat, stride, rng in zip((p3, p4, p5, p6, p7), _FCOS_STRIDES, _FCOS_RANGES):
        h, w = feat.shape[-2:]
        ys, xs = jnp.meshgrid(jnp.arange(h, dtype=feat.dtype), jnp.arange(w, dtype=feat.dtype), indexing="ij")
        pts = (jnp.stack([xs.reshape(-1), ys.reshape(-1)], -1) + 0.5) * stride
        points.append(pts)
        strides.append(jnp.full((h * w,), float(stride), dtype=feat.dtype))
        ranges.append(jnp.broadcast_to(jnp.asarray(rng, dtype=feat.dtype), (h * w, 2)))
    return jnp.concatenate(points), jnp.concatenate(strides), jnp.concatenate(ranges)


@operator(
    domain="anchor",
    tags=("view", "loop", "container", "broadcast"),
    reference="FCOS (Tian et al. 2019) anchor-free points with per-level regress ranges, "
    "as in mmdet MlvlPointGenerator",
    inputs=_fcos_inputs,
    jax=_fcos_points_jax,
)
def fcos_points(p3, p4, p5, p6, p7):
    """Centres of every feature cell of five levels, their strides and their regress ranges."""
    points, strides, regress_ranges = [], [], []
    for feat, stride, rng in zip((p3, p4, p5, p6, p7), _FCOS_STRIDES, _FCOS_RANGES):
        feat_h, feat_w = feat.shape[-2:]
        shift_x = (torch.arange(0, feat_w, dtype=feat.dtype) + 0.5) * stride
        shift_y = (torch.arange(0, feat_h, dtype=feat.dtype) + 0.5) * stride
        shift_xx, shift_yy = _mesh(shift_x, shift_y)
        points.append(torch.stack([shift_xx, shift_yy], dim=-1))
        strides.append(feat.new_full((feat_h * feat_w,), stride))
        regress_ranges.append(feat.new_tensor(rng)[None].expand(feat_h * feat_w, 2))
    return torch.cat(points), torch.cat(strides), torch.cat(regress_ranges)


def _valid_flags_inputs(size, gen):
    padded, (img_h, img_w) = (160, (150, 112)) if size == "small" else (1280, (1216, 900))
    feats = _levels(padded, _RETINA_STRIDES, gen)
    anchors = anchor_grid(*feats, *_retina_scales_ratios())
    return (*feats, anchors, torch.tensor([img_h, img_w]))


@operator(
    domain="anchor",
    tags=("view", "branch", "loop", "input-dependent", "container", "broadcast", "inplace"),
    reference="Valid and inside-image anchor flags of padded batches, as in mmdet "
    "AnchorGenerator.valid_flags and anchor_inside_flags",
    inputs=_valid_flags_inputs,
)
def anchor_valid_flags(feat_p3, feat_p4, feat_p5, anchors, img_hw):
    """Anchors on the unpadded part of each feature map whose box also lies inside the image."""
    img_h, img_w = img_hw.tolist()
    num_base = anchors.size(0) // sum(f.shape[-2] * f.shape[-1] for f in (feat_p3, feat_p4, feat_p5))
    flags = []
    for feat, stride in zip((feat_p3, feat_p4, feat_p5), _RETINA_STRIDES):
        feat_h, feat_w = feat.shape[-2:]
        valid_h = min(int(math.ceil(img_h / stride)), feat_h)
        valid_w = min(int(math.ceil(img_w / stride)), feat_w)
        valid_x = torch.zeros(feat_w, dtype=torch.bool)
        valid_y = torch.zeros(feat_h, dtype=torch.bool)
        valid_x[:valid_w] = 1
        valid_y[:valid_h] = 1
        valid_xx, valid_yy = _mesh(valid_x, valid_y)
        valid = valid_xx & valid_yy
        valid = valid[:, None].expand(valid.size(0), num_base).contiguous().view(-1)
        flags.append(valid)
    valid_flags = torch.cat(flags)
    allowed_border = 0
    if allowed_border >= 0:
        inside_flags = (
            valid_flags
            & (anchors[:, 0] >= -allowed_border)
            & (anchors[:, 1] >= -allowed_border)
            & (anchors[:, 2] < img_w + allowed_border)
            & (anchors[:, 3] < img_h + allowed_border)
        )
    else:
        inside_flags = valid_flags
    return inside_flags
