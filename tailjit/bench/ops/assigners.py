"""Label assigners and samplers: which anchors/points learn which ground truth.

``assigned_gt_inds`` follows mmdet's convention: ``-1`` ignore, ``0``
background, ``k > 0`` matched to ground truth ``k - 1``.
"""

from __future__ import annotations

import torch

from tailjit.bench.ops.anchors import fcos_points
from tailjit.bench.ops.box_coders import random_boxes
from tailjit.bench.registry import operator

_INF = 100_000_000.0


def _box_iou(boxes1, boxes2):
    """(N, M) IoU matrix."""
    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area1[:, None] + area2[None, :] - inter).clamp(min=1e-6)


def _max_iou_inputs(size, gen):
    n, g = (1000, 20) if size == "small" else (100_000, 30)
    return random_boxes(n, gen), random_boxes(g, gen)


@operator(
    domain="assigner",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "broadcast", "inplace"),
    reference="Max-IoU assigner with low-quality matches (Faster R-CNN / RetinaNet), as in mmdet MaxIoUAssigner",
    inputs=_max_iou_inputs,
)
def max_iou_assign(bboxes, gt_bboxes):
    """Assign each box to its best ground truth by IoU thresholds, then give every gt its best boxes."""
    pos_iou_thr, neg_iou_thr, min_pos_iou = 0.5, 0.4, 0.1
    overlaps = _box_iou(gt_bboxes, bboxes)
    num_gts, num_bboxes = overlaps.size()
    assigned_gt_inds = overlaps.new_full((num_bboxes,), -1, dtype=torch.long)
    max_overlaps, argmax_overlaps = overlaps.max(dim=0)
    gt_max_overlaps, _ = overlaps.max(dim=1)
    assigned_gt_inds[(max_overlaps >= 0) & (max_overlaps < neg_iou_thr)] = 0
    pos_inds = max_overlaps >= pos_iou_thr
    assigned_gt_inds[pos_inds] = argmax_overlaps[pos_inds] + 1
    for i in range(num_gts):
        if gt_max_overlaps[i] >= min_pos_iou:
            max_iou_inds = overlaps[i, :] == gt_max_overlaps[i]
            assigned_gt_inds[max_iou_inds] = i + 1
    return assigned_gt_inds, max_overlaps


def _atss_inputs(size, gen):
    levels, g = ((600, 150, 40), 10) if size == "small" else ((80_000, 20_000, 5_000), 20)
    return (*(random_boxes(n, gen) for n in levels), random_boxes(g, gen))


@operator(
    domain="assigner",
    tags=("view", "reduction", "loop", "adv-index", "input-dependent", "container", "broadcast", "inplace"),
    reference="ATSS adaptive training sample selection (Zhang et al. 2020), as in mmdet ATSSAssigner",
    inputs=_atss_inputs,
)
def atss_assign(anchors_p3, anchors_p4, anchors_p5, gt_bboxes):
    """Per-level top-k nearest anchors per gt, positive if IoU >= mean + std and centre inside the gt."""
    topk = 9
    bboxes = torch.cat((anchors_p3, anchors_p4, anchors_p5))
    num_gt, num_bboxes = gt_bboxes.size(0), bboxes.size(0)
    overlaps = _box_iou(bboxes, gt_bboxes)
    gt_cx = (gt_bboxes[:, 0] + gt_bboxes[:, 2]) / 2.0
    gt_cy = (gt_bboxes[:, 1] + gt_bboxes[:, 3]) / 2.0
    gt_points = torch.stack((gt_cx, gt_cy), dim=1)
    bboxes_cx = (bboxes[:, 0] + bboxes[:, 2]) / 2.0
    bboxes_cy = (bboxes[:, 1] + bboxes[:, 3]) / 2.0
    bboxes_points = torch.stack((bboxes_cx, bboxes_cy), dim=1)
    distances = (bboxes_points[:, None, :] - gt_points[None, :, :]).pow(2).sum(-1).sqrt()

    candidate_idxs = []
    start_idx = 0
    for level_bboxes in (anchors_p3, anchors_p4, anchors_p5):
        end_idx = start_idx + level_bboxes.size(0)
        distances_per_level = distances[start_idx:end_idx, :]
        selectable_k = min(topk, level_bboxes.size(0))
        _, topk_idxs_per_level = distances_per_level.topk(selectable_k, dim=0, largest=False)
        candidate_idxs.append(topk_idxs_per_level + start_idx)
        start_idx = end_idx
    candidate_idxs = torch.cat(candidate_idxs, dim=0)

    candidate_overlaps = overlaps[candidate_idxs, torch.arange(num_gt)]
    overlaps_thr_per_gt = candidate_overlaps.mean(0) + candidate_overlaps.std(0)
    is_pos = candidate_overlaps >= overlaps_thr_per_gt[None, :]

    for gt_idx in range(num_gt):
        candidate_idxs[:, gt_idx] += gt_idx * num_bboxes
    ep_bboxes_cx = bboxes_cx.view(1, -1).expand(num_gt, num_bboxes).contiguous().view(-1)
    ep_bboxes_cy = bboxes_cy.view(1, -1).expand(num_gt, num_bboxes).contiguous().view(-1)
    candidate_idxs = candidate_idxs.view(-1)
    l_ = ep_bboxes_cx[candidate_idxs].view(-1, num_gt) - gt_bboxes[:, 0]
    t_ = ep_bboxes_cy[candidate_idxs].view(-1, num_gt) - gt_bboxes[:, 1]
    r_ = gt_bboxes[:, 2] - ep_bboxes_cx[candidate_idxs].view(-1, num_gt)
    b_ = gt_bboxes[:, 3] - ep_bboxes_cy[candidate_idxs].view(-1, num_gt)
    is_in_gts = torch.stack([l_, t_, r_, b_], dim=1).min(dim=1)[0] > 0.01
    is_pos = is_pos & is_in_gts

    overlaps_inf = torch.full_like(overlaps, -_INF).t().contiguous().view(-1)
    index = candidate_idxs.view(-1)[is_pos.view(-1)]
    overlaps_inf[index] = overlaps.t().contiguous().view(-1)[index]
    overlaps_inf = overlaps_inf.view(num_gt, -1).t()
    max_overlaps, argmax_overlaps = overlaps_inf.max(dim=1)
    assigned_gt_inds = overlaps.new_zeros((num_bboxes,), dtype=torch.long)
    matched = max_overlaps != -_INF
    assigned_gt_inds[matched] = argmax_overlaps[matched] + 1
    return assigned_gt_inds, max_overlaps


def _fcos_target_inputs(size, gen):
    image, g = (320, 10) if size == "small" else (2048, 12)
    feats = tuple(torch.zeros(1, 1, -(-image // s), -(-image // s)) for s in (8, 16, 32, 64, 128))
    points, strides, regress_ranges = fcos_points(*feats)
    gt_bboxes = random_boxes(g, gen, img_size=float(image))
    gt_labels = torch.randint(0, 80, (g,), generator=gen)
    return points, regress_ranges, strides, gt_bboxes, gt_labels


@operator(
    domain="assigner",
    tags=("view", "reduction", "branch", "adv-index", "input-dependent", "broadcast", "inplace"),
    reference="FCOS targets with centre sampling (Tian et al. 2019), as in mmdet FCOSHead.get_targets",
    inputs=_fcos_target_inputs,
)
def fcos_targets(points, regress_ranges, strides, gt_bboxes, gt_labels):
    """Class label and (l, t, r, b) target of every point: smallest gt whose centre region and range fit."""
    num_classes, radius, center_sampling = 80, 1.5, True
    num_points, num_gts = points.size(0), gt_labels.size(0)
    areas = (gt_bboxes[:, 2] - gt_bboxes[:, 0]) * (gt_bboxes[:, 3] - gt_bboxes[:, 1])
    areas = areas[None].repeat(num_points, 1)
    regress_ranges = regress_ranges[:, None, :].expand(num_points, num_gts, 2)
    gt_bboxes = gt_bboxes[None].expand(num_points, num_gts, 4)
    xs = points[:, 0][:, None].expand(num_points, num_gts)
    ys = points[:, 1][:, None].expand(num_points, num_gts)
    left = xs - gt_bboxes[..., 0]
    right = gt_bboxes[..., 2] - xs
    top = ys - gt_bboxes[..., 1]
    bottom = gt_bboxes[..., 3] - ys
    bbox_targets = torch.stack((left, top, right, bottom), -1)

    if center_sampling:
        center_xs = (gt_bboxes[..., 0] + gt_bboxes[..., 2]) / 2
        center_ys = (gt_bboxes[..., 1] + gt_bboxes[..., 3]) / 2
        center_gts = torch.zeros_like(gt_bboxes)
        stride = strides[:, None].expand(num_points, num_gts) * radius
        x_mins, y_mins = center_xs - stride, center_ys - stride
        x_maxs, y_maxs = center_xs + stride, center_ys + stride
        center_gts[..., 0] = torch.where(x_mins > gt_bboxes[..., 0], x_mins, gt_bboxes[..., 0])
        center_gts[..., 1] = torch.where(y_mins > gt_bboxes[..., 1], y_mins, gt_bboxes[..., 1])
        center_gts[..., 2] = torch.where(x_maxs > gt_bboxes[..., 2], gt_bboxes[..., 2], x_maxs)
        center_gts[..., 3] = torch.where(y_maxs > gt_bboxes[..., 3], gt_bboxes[..., 3], y_maxs)
        cb_dist_left = xs - center_gts[..., 0]
        cb_dist_right = center_gts[..., 2] - xs
        cb_dist_top = ys - center_gts[..., 1]
        cb_dist_bottom = center_gts[..., 3] - ys
        center_bbox = torch.stack((cb_dist_left, cb_dist_top, cb_dist_right, cb_dist_bottom), -1)
        inside_gt_bbox_mask = center_bbox.min(-1)[0] > 0
    else:
        inside_gt_bbox_mask = bbox_targets.min(-1)[0] > 0

    max_regress_distance = bbox_targets.max(-1)[0]
    inside_regress_range = (max_regress_distance >= regress_ranges[..., 0]) & (
        max_regress_distance <= regress_ranges[..., 1]
    )
    areas[inside_gt_bbox_mask == 0] = _INF
    areas[inside_regress_range == 0] = _INF
    min_area, min_area_inds = areas.min(dim=1)
    labels = gt_labels[min_area_inds]
    labels[min_area == _INF] = num_classes
    bbox_targets = bbox_targets[range(num_points), min_area_inds]
    return labels, bbox_targets


def _sampler_inputs(size, gen):
    batch, n = (8, 1000) if size == "small" else (16, 20_000)
    u = torch.rand(batch, n, generator=gen)
    gt = torch.randint(1, 20, (batch, n), generator=gen)
    assigned = torch.where(u < 0.05, gt, torch.where(u < 0.15, torch.full_like(gt, -1), torch.zeros_like(gt)))
    return assigned, torch.rand(batch, n, generator=gen)


@operator(
    domain="assigner",
    tags=("view", "reduction", "branch", "loop", "adv-index", "input-dependent", "container"),
    reference="Deterministic top-score positive/negative sampler (a random-free variant of mmdet "
    "RandomSampler, ranking as in OHEM, Shrivastava et al. 2016)",
    inputs=_sampler_inputs,
)
def topscore_sampler(assigned_gt_inds, scores):
    """Per image, keep at most 128 positives and fill 512 samples with negatives, highest scores first.

    Returns flat indices into the (B * N) boxes of the batch.
    """
    num, pos_fraction = 512, 0.25
    num_expected_pos = int(num * pos_fraction)
    all_pos, all_neg = [], []
    for img_id in range(assigned_gt_inds.size(0)):
        assigned, score = assigned_gt_inds[img_id], scores[img_id]
        offset = img_id * assigned.numel()
        pos_inds = torch.nonzero(assigned > 0, as_tuple=False).squeeze(1)
        if pos_inds.numel() > num_expected_pos:
            order = score[pos_inds].argsort(descending=True, stable=True)
            pos_inds = pos_inds[order[:num_expected_pos]]
        num_expected_neg = num - pos_inds.numel()
        neg_inds = torch.nonzero(assigned == 0, as_tuple=False).squeeze(1)
        if neg_inds.numel() > num_expected_neg:
            order = score[neg_inds].argsort(descending=True, stable=True)
            neg_inds = neg_inds[order[:num_expected_neg]]
        all_pos.append(pos_inds + offset)
        all_neg.append(neg_inds + offset)
    return torch.cat(all_pos), torch.cat(all_neg)


def _hard_negative_inputs(size, gen):
    batch, n = (32, 8732) if size == "small" else (16, 24_564)
    conf_loss = -torch.log(torch.rand(batch, n, generator=gen).clamp(min=1e-6))
    labels = torch.where(
        torch.rand(batch, n, generator=gen) < 0.02,
        torch.randint(1, 21, (batch, n), generator=gen),
        torch.zeros(batch, n, dtype=torch.long),
    )
    return conf_loss, labels


def _hard_negative_jax(conf_loss, labels):
    import jax.numpy as jnp

    pos = labels > 0
    num_neg = jnp.minimum(3 * pos.sum(axis=1, keepdims=True), pos.shape[1] - 1)
    loss = jnp.where(pos, 0.0, conf_loss)
    loss_idx = jnp.argsort(-loss, axis=1, stable=True)
    idx_rank = jnp.argsort(loss_idx, axis=1, stable=True)
    return pos | (idx_rank < num_neg)


@operator(
    domain="assigner",
    tags=("view", "reduction", "adv-index", "input-dependent", "broadcast", "inplace"),
    reference="SSD hard negative mining (Liu et al. 2016): negatives ranked by confidence loss, 3:1 to positives",
    inputs=_hard_negative_inputs,
    jax=_hard_negative_jax,
)
def hard_negative_mining(conf_loss, labels):
    """Mask of positives plus the 3 * num_pos negatives with the largest loss in each image."""
    neg_pos_ratio = 3
    pos = labels > 0
    num_pos = pos.long().sum(dim=1, keepdim=True)
    num_neg = torch.clamp(neg_pos_ratio * num_pos, max=pos.size(1) - 1)
    loss = conf_loss.clone()
    loss[pos] = 0
    _, loss_idx = loss.sort(dim=1, descending=True, stable=True)
    _, idx_rank = loss_idx.sort(dim=1, stable=True)
    neg = idx_rank < num_neg.expand_as(idx_rank)
    return pos | neg
