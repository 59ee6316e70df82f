"""Heatmap and keypoint operators: CenterNet targets and decoding, pose-estimation heatmaps, OKS.

Heatmaps are ``(B, C, H, W)``; boxes on them are ``(x1, y1, x2, y2)`` in heatmap cells.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tailjit.bench.ops.box_coders import random_boxes
from tailjit.bench.registry import operator

#: COCO per-keypoint OKS constants (Lin et al. 2014, keypoint evaluation).
_COCO_SIGMAS = (
    0.026,
    0.025,
    0.025,
    0.035,
    0.035,
    0.079,
    0.079,
    0.072,
    0.072,
    0.062,
    0.062,
    0.107,
    0.107,
    0.087,
    0.087,
    0.089,
    0.089,
)
_NUM_JOINTS = len(_COCO_SIGMAS)
_TOPK = 100
_POSE_SIGMA = 2
_POSE_STRIDE = 4


def _gaussian_radius(height, width, min_overlap=0.7):
    """CornerNet's radius: the smallest of the three corner-shift cases that keep IoU >= min_overlap."""
    a1 = 1
    b1 = height + width
    c1 = width * height * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(b1**2 - 4 * a1 * c1)) / 2
    a2 = 4
    b2 = 2 * (height + width)
    c2 = (1 - min_overlap) * width * height
    r2 = (b2 + math.sqrt(b2**2 - 4 * a2 * c2)) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (height + width)
    c3 = (min_overlap - 1) * width * height
    r3 = (b3 + math.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


def _gaussian_2d(radius, sigma, dtype):
    coords = torch.arange(-radius, radius + 1, dtype=dtype)
    y = coords[:, None]
    x = coords[None, :]
    h = torch.exp(-(x * x + y * y) / (2 * sigma * sigma))
    h[h < torch.finfo(dtype).eps * h.max()] = 0
    return h


def _draw_gaussian(heatmap, center_x, center_y, radius):
    """Max-blend a Gaussian of the given radius into ``heatmap`` (H, W) around the centre, in place."""
    diameter = 2 * radius + 1
    gaussian = _gaussian_2d(radius, diameter / 6, heatmap.dtype)
    height, width = heatmap.shape
    left, right = min(center_x, radius), min(width - center_x, radius + 1)
    top, bottom = min(center_y, radius), min(height - center_y, radius + 1)
    masked_heatmap = heatmap[center_y - top : center_y + bottom, center_x - left : center_x + right]
    masked_gaussian = gaussian[radius - top : radius + bottom, radius - left : radius + right]
    if min(masked_gaussian.shape) > 0 and min(masked_heatmap.shape) > 0:
        heatmap[center_y - top : center_y + bottom, center_x - left : center_x + right] = torch.maximum(
            masked_heatmap, masked_gaussian
        )
    return heatmap


def _centernet_target_inputs(size, gen):
    batch, num_objs = (8, 16) if size == "small" else (16, 96)
    boxes = random_boxes(batch * num_objs, gen, img_size=512.0).view(batch, num_objs, 4) / 4
    padding = torch.rand(batch, num_objs, 1, generator=gen) < 0.25
    boxes = torch.where(padding, torch.zeros_like(boxes), boxes)
    labels = torch.randint(0, 80, (batch, num_objs), generator=gen)
    feat = torch.zeros(batch, 80, 128, 128)
    return boxes, labels, feat


@operator(
    domain="heatmap",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "broadcast", "inplace"),
    reference="CenterNet / Objects as Points (Zhou et al. 2019) targets with CornerNet's Gaussian radius "
    "(Law & Deng 2018)",
    inputs=_centernet_target_inputs,
)
def centernet_targets(gt_bboxes, gt_labels, feat):
    """Class heatmaps with a Gaussian per object, plus size, sub-cell offset, flat index and mask per object.

    Zero-size boxes are padding and are skipped.
    """
    batch, _, out_h, out_w = feat.shape
    max_objs = gt_bboxes.size(1)
    heatmap = feat.new_zeros(feat.shape)
    wh = feat.new_zeros((batch, max_objs, 2))
    offset = feat.new_zeros((batch, max_objs, 2))
    ind = torch.zeros((batch, max_objs), dtype=torch.long)
    reg_mask = torch.zeros((batch, max_objs), dtype=torch.bool)
    for b in range(batch):
        for k in range(max_objs):
            box = gt_bboxes[b, k]
            h = float(box[3] - box[1])
            w = float(box[2] - box[0])
            if h <= 0 or w <= 0:
                continue
            radius = max(0, int(_gaussian_radius(math.ceil(h), math.ceil(w))))
            ctr_x = float(box[0] + box[2]) / 2
            ctr_y = float(box[1] + box[3]) / 2
            cx, cy = int(ctr_x), int(ctr_y)
            _draw_gaussian(heatmap[b, int(gt_labels[b, k])], cx, cy, radius)
            wh[b, k, 0] = w
            wh[b, k, 1] = h
            ind[b, k] = cy * out_w + cx
            offset[b, k, 0] = ctr_x - cx
            offset[b, k, 1] = ctr_y - cy
            reg_mask[b, k] = True
    return heatmap, wh, offset, ind, reg_mask


def _centernet_decode_inputs(size, gen):
    batch, side = (8, 64) if size == "small" else (8, 96)
    heat = torch.randn(batch, 80, side, side, generator=gen) - 2.0
    wh = 4.0 + 28.0 * torch.rand(batch, 2, side, side, generator=gen)
    reg = torch.rand(batch, 2, side, side, generator=gen)
    return heat, wh, reg


def _transpose_and_gather(feat, ind):
    """Values of a (B, D, H, W) map at flat spatial indices ``ind`` (B, K) as (B, K, D)."""
    feat = feat.permute(0, 2, 3, 1).contiguous()
    feat = feat.view(feat.size(0), -1, feat.size(3))
    ind = ind.unsqueeze(2).expand(ind.size(0), ind.size(1), feat.size(2))
    return feat.gather(1, ind)


def _centernet_decode_jax(heat, wh, reg):
    import jax
    import jax.numpy as jnp

    batch, _, height, width = heat.shape
    heat = jax.nn.sigmoid(heat)
    hmax = jax.lax.reduce_window(heat, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")
    heat = heat * (hmax == heat)
    scores, inds = jax.lax.top_k(heat.reshape(batch, -1), _TOPK)
    clses = inds // (height * width)
    inds = inds % (height * width)
    ys = (inds // width).astype(heat.dtype)
    xs = (inds % width).astype(heat.dtype)
    reg = jnp.take_along_axis(reg.reshape(batch, 2, -1), inds[:, None, :], axis=2)
    wh = jnp.take_along_axis(wh.reshape(batch, 2, -1), inds[:, None, :], axis=2)
    xs, ys = xs + reg[:, 0], ys + reg[:, 1]
    bboxes = jnp.stack([xs - wh[:, 0] / 2, ys - wh[:, 1] / 2, xs + wh[:, 0] / 2, ys + wh[:, 1] / 2], axis=2)
    return bboxes, scores, clses


@operator(
    domain="heatmap",
    tags=("view", "reduction", "adv-index", "container", "broadcast"),
    reference="CenterNet (Zhou et al. 2019) decoding: 3x3 max-pool peak NMS, top-k, size/offset gather",
    inputs=_centernet_decode_inputs,
    jax=_centernet_decode_jax,
)
def centernet_decode(heat, wh, reg):
    """Top-100 peaks of the class heatmaps as boxes, scores and class ids."""
    batch, _, height, width = heat.shape
    heat = heat.sigmoid()
    hmax = F.max_pool2d(heat, (3, 3), stride=1, padding=1)
    keep = (hmax == heat).float()
    heat = heat * keep
    scores, inds = torch.topk(heat.view(batch, -1), _TOPK)
    clses = inds // (height * width)
    inds = inds % (height * width)
    ys = (inds // width).float()
    xs = (inds % width).float()
    reg = _transpose_and_gather(reg, inds)
    xs = xs + reg[..., 0]
    ys = ys + reg[..., 1]
    wh = _transpose_and_gather(wh, inds)
    bboxes = torch.stack([xs - wh[..., 0] / 2, ys - wh[..., 1] / 2, xs + wh[..., 0] / 2, ys + wh[..., 1] / 2], dim=2)
    return bboxes, scores, clses


def _pose_heatmap_inputs(size, gen):
    batch = 32 if size == "small" else 128
    return (0.1 * torch.randn(batch, _NUM_JOINTS, 64, 48, generator=gen),)


def _keypoint_decode_jax(heatmaps):
    import jax.numpy as jnp

    batch, joints, height, width = heatmaps.shape
    flat = heatmaps.reshape(batch, joints, -1)
    idx = jnp.argmax(flat, axis=2)
    maxvals = jnp.max(flat, axis=2)[..., None]
    preds = jnp.stack([idx % width, idx // width], axis=-1).astype(heatmaps.dtype)
    preds = preds * (maxvals > 0.0)
    px = jnp.floor(preds[..., 0] + 0.5).astype(jnp.int32)
    py = jnp.floor(preds[..., 1] + 0.5).astype(jnp.int32)
    inside = (px > 1) & (px < width - 1) & (py > 1) & (py < height - 1)

    def at(y, x):
        flat_idx = jnp.clip(y, 0, height - 1) * width + jnp.clip(x, 0, width - 1)
        return jnp.take_along_axis(flat, flat_idx[..., None], axis=2)[..., 0]

    diff = jnp.stack([at(py, px + 1) - at(py, px - 1), at(py + 1, px) - at(py - 1, px)], axis=-1)
    return preds + jnp.where(inside[..., None], jnp.sign(diff) * 0.25, 0.0), maxvals


@operator(
    domain="heatmap",
    tags=("view", "reduction", "branch", "loop", "adv-index", "container", "broadcast", "inplace"),
    reference="Keypoint argmax decoding with quarter-offset refinement, as in Simple Baselines "
    "(Xiao et al. 2018) get_final_preds",
    inputs=_pose_heatmap_inputs,
    jax=_keypoint_decode_jax,
)
def keypoint_argmax_decode(heatmaps):
    """Per-joint (x, y) of the heatmap maximum, shifted a quarter cell towards the higher neighbour."""
    batch, joints, height, width = heatmaps.shape
    flat = heatmaps.reshape(batch, joints, -1)
    maxvals, idx = torch.max(flat, 2)
    maxvals = maxvals.unsqueeze(-1)
    idx = idx.unsqueeze(-1).float()
    preds = idx.repeat(1, 1, 2)
    preds[..., 0] = idx[..., 0] % width
    preds[..., 1] = torch.floor(idx[..., 0] / width)
    preds *= (maxvals > 0.0).float()
    for n in range(batch):
        for p in range(joints):
            hm = heatmaps[n, p]
            px = int(math.floor(preds[n, p, 0] + 0.5))
            py = int(math.floor(preds[n, p, 1] + 0.5))
            if 1 < px < width - 1 and 1 < py < height - 1:
                diff = torch.stack([hm[py][px + 1] - hm[py][px - 1], hm[py + 1][px] - hm[py - 1][px]])
                preds[n, p] += torch.sign(diff) * 0.25
    return preds, maxvals


def _oks_inputs(size, gen):
    num_pred, num_gt = (100, 20) if size == "small" else (2000, 200)
    boxes = random_boxes(num_gt, gen)
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)
    rel = torch.rand(num_gt, _NUM_JOINTS, 2, generator=gen)
    kpts = boxes[:, None, :2] + rel * xywh[:, None, 2:]
    vis = torch.randint(0, 3, (num_gt, _NUM_JOINTS, 1), generator=gen).float()
    vis[::5] = 0  # every fifth person has no labelled keypoint
    gt = torch.cat([kpts, vis], dim=2)
    areas = xywh[:, 2] * xywh[:, 3] * 0.6
    owner = torch.randint(0, num_gt, (num_pred,), generator=gen)
    pred = kpts[owner] + 8.0 * torch.randn(num_pred, _NUM_JOINTS, 2, generator=gen)
    return pred, gt, areas, xywh


def _oks_jax(pred, gt, areas, gt_boxes):
    import jax.numpy as jnp

    variances = (jnp.asarray(_COCO_SIGMAS, dtype=pred.dtype) * 2) ** 2
    vis = gt[:, :, 2] > 0
    k1 = vis.sum(axis=1)
    xd, yd = pred[:, None, :, 0], pred[:, None, :, 1]
    x0 = (gt_boxes[:, 0] - gt_boxes[:, 2])[None, :, None]
    x1 = (gt_boxes[:, 0] + gt_boxes[:, 2] * 2)[None, :, None]
    y0 = (gt_boxes[:, 1] - gt_boxes[:, 3])[None, :, None]
    y1 = (gt_boxes[:, 1] + gt_boxes[:, 3] * 2)[None, :, None]
    has_vis = (k1 > 0)[None, :, None]
    dx = jnp.where(has_vis, xd - gt[None, :, :, 0], jnp.maximum(0, x0 - xd) + jnp.maximum(0, xd - x1))
    dy = jnp.where(has_vis, yd - gt[None, :, :, 1], jnp.maximum(0, y0 - yd) + jnp.maximum(0, yd - y1))
    e = (dx**2 + dy**2) / variances / (areas[None, :, None] + 2.220446049250313e-16) / 2
    counted = jnp.where(has_vis, vis[None], True)
    total = jnp.where(counted, jnp.exp(-e), 0.0).sum(axis=2)
    return total / jnp.where(k1 > 0, k1, _NUM_JOINTS)[None, :]


@operator(
    domain="heatmap",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "inplace"),
    reference="Object keypoint similarity of the COCO keypoint evaluation (Lin et al. 2014), "
    "as in pycocotools COCOeval.computeOks",
    inputs=_oks_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_oks_jax,
)
def keypoint_oks(pred, gt, areas, gt_boxes):
    """(N, M) OKS of predicted poses vs ground-truth poses (x, y, visibility) with xywh boxes.

    A ground truth without labelled keypoints is compared through the distance to its enlarged box.
    """
    variances = (pred.new_tensor(_COCO_SIGMAS) * 2) ** 2
    ious = pred.new_zeros((pred.size(0), gt.size(0)))
    xd, yd = pred[:, :, 0], pred[:, :, 1]
    for j in range(gt.size(0)):
        xg, yg, vg = gt[j, :, 0], gt[j, :, 1], gt[j, :, 2]
        k1 = int((vg > 0).sum())
        bx, by, bw, bh = gt_boxes[j].unbind()
        x0, x1 = bx - bw, bx + bw * 2
        y0, y1 = by - bh, by + bh * 2
        if k1 > 0:
            dx = xd - xg
            dy = yd - yg
        else:
            z = torch.zeros_like(xd)
            dx = torch.maximum(z, x0 - xd) + torch.maximum(z, xd - x1)
            dy = torch.maximum(z, y0 - yd) + torch.maximum(z, yd - y1)
        e = (dx**2 + dy**2) / variances / (areas[j] + 2.220446049250313e-16) / 2
        if k1 > 0:
            e = e[:, vg > 0]
        ious[:, j] = torch.sum(torch.exp(-e), dim=1) / e.shape[1]
    return ious


def _pose_target_inputs(size, gen):
    batch = 32 if size == "small" else 128
    hm_h, hm_w = 64, 48
    xy = torch.rand(batch, _NUM_JOINTS, 2, generator=gen) * 1.2 - 0.1
    xy = xy * torch.tensor([hm_w * _POSE_STRIDE, hm_h * _POSE_STRIDE])
    vis = torch.randint(0, 3, (batch, _NUM_JOINTS, 1), generator=gen).float()
    return torch.cat([xy, vis], dim=2), torch.zeros(batch, _NUM_JOINTS, hm_h, hm_w)


@operator(
    domain="heatmap",
    tags=("view", "branch", "loop", "broadcast", "inplace"),
    reference="Gaussian keypoint heatmap targets with visibility weights, as in Simple Baselines "
    "(Xiao et al. 2018) JointsDataset.generate_target",
    inputs=_pose_target_inputs,
)
def keypoint_heatmap_targets(joints, feat):
    """Per-joint Gaussian target heatmaps and target weights (0 for unlabelled or off-map joints)."""
    batch, num_joints, hm_h, hm_w = feat.shape
    target = feat.new_zeros(feat.shape)
    target_weight = (joints[..., 2:3] > 0).to(feat.dtype)
    tmp_size = _POSE_SIGMA * 3
    size = 2 * tmp_size + 1
    x = torch.arange(0, size, dtype=feat.dtype)
    y = x[:, None]
    x0 = y0 = size // 2
    g = torch.exp(-((x - x0) ** 2 + (y - y0) ** 2) / (2 * _POSE_SIGMA**2))
    for b in range(batch):
        for j in range(num_joints):
            mu_x = int(joints[b, j, 0] / _POSE_STRIDE + 0.5)
            mu_y = int(joints[b, j, 1] / _POSE_STRIDE + 0.5)
            ul = (mu_x - tmp_size, mu_y - tmp_size)
            br = (mu_x + tmp_size + 1, mu_y + tmp_size + 1)
            if ul[0] >= hm_w or ul[1] >= hm_h or br[0] < 0 or br[1] < 0:
                target_weight[b, j] = 0
                continue
            g_x = max(0, -ul[0]), min(br[0], hm_w) - ul[0]
            g_y = max(0, -ul[1]), min(br[1], hm_h) - ul[1]
            img_x = max(0, ul[0]), min(br[0], hm_w)
            img_y = max(0, ul[1]), min(br[1], hm_h)
            if target_weight[b, j] > 0.5:
                target[b, j, img_y[0] : img_y[1], img_x[0] : img_x[1]] = g[g_y[0] : g_y[1], g_x[0] : g_x[1]]
    return target, target_weight


def _focal_inputs(size, gen):
    batch, classes, side = (8, 80, 64) if size == "small" else (16, 20, 128)
    pred = torch.randn(batch, classes, side, side, generator=gen) - 2.0
    target = torch.rand(batch, classes, side, side, generator=gen) ** 8
    peaks = torch.rand(batch, classes, side, side, generator=gen) < 0.002
    return pred, torch.where(peaks, torch.ones_like(target), target)


def _gaussian_focal_jax(pred_logits, target):
    import jax
    import jax.numpy as jnp

    pred = jnp.clip(jax.nn.sigmoid(pred_logits), 1e-4, 1 - 1e-4)
    pos = (target == 1).astype(pred.dtype)
    neg = (target < 1).astype(pred.dtype)
    pos_loss = (jnp.log(pred) * (1 - pred) ** 2 * pos).sum()
    neg_loss = (jnp.log(1 - pred) * pred**2 * (1 - target) ** 4 * neg).sum()
    num_pos = pos.sum()
    return jnp.where(num_pos == 0, -neg_loss, -(pos_loss + neg_loss) / jnp.maximum(num_pos, 1.0))


@operator(
    domain="heatmap",
    tags=("reduction", "branch"),
    reference="Penalty-reduced pixel-wise focal loss on Gaussian heatmaps (CornerNet, Law & Deng 2018; "
    "CenterNet, Zhou et al. 2019)",
    inputs=_focal_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_gaussian_focal_jax,
)
def gaussian_focal_loss(pred_logits, target):
    """Focal loss normalised by the number of peaks, negatives down-weighted near peaks by (1 - y)^4."""
    pred = torch.clamp(pred_logits.sigmoid(), min=1e-4, max=1 - 1e-4)
    pos_inds = target.eq(1).float()
    neg_inds = target.lt(1).float()
    neg_weights = torch.pow(1 - target, 4)
    pos_loss = torch.log(pred) * torch.pow(1 - pred, 2) * pos_inds
    neg_loss = torch.log(1 - pred) * torch.pow(pred, 2) * neg_weights * neg_inds
    num_pos = pos_inds.sum()
    pos_loss = pos_loss.sum()
    neg_loss = neg_loss.sum()
    if num_pos == 0:
        return -neg_loss
    return -(pos_loss + neg_loss) / num_pos
