"""Long-tail functions written as researchers write them, compiled with both entries
(``torch.compile(backend="tailjit")`` and ``tailjit.jit``), forward and backward, against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tailjit
from tailjit.frontend.plan.report import collect_reports


def bbox2delta(proposals, gt, means=(0.0, 0.0, 0.0, 0.0), stds=(0.1, 0.1, 0.2, 0.2)):
    pw = proposals[:, 2] - proposals[:, 0]
    ph = proposals[:, 3] - proposals[:, 1]
    px = proposals[:, 0] + 0.5 * pw
    py = proposals[:, 1] + 0.5 * ph
    gw = gt[:, 2] - gt[:, 0]
    gh = gt[:, 3] - gt[:, 1]
    gx = gt[:, 0] + 0.5 * gw
    gy = gt[:, 1] + 0.5 * gh
    deltas = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], dim=-1)
    return (deltas - deltas.new_tensor(means)) / deltas.new_tensor(stds)


def delta2bbox(rois, deltas, max_shape=(64, 80), wh_ratio_clip=16 / 1000):
    means = deltas.new_tensor([0.0, 0.0, 0.0, 0.0])
    stds = deltas.new_tensor([0.1, 0.1, 0.2, 0.2])
    d = deltas * stds + means
    max_ratio = abs(torch.log(torch.tensor(wh_ratio_clip))).item()
    dw = d[:, 2].clamp(min=-max_ratio, max=max_ratio)
    dh = d[:, 3].clamp(min=-max_ratio, max=max_ratio)
    px = (rois[:, 0] + rois[:, 2]) * 0.5
    py = (rois[:, 1] + rois[:, 3]) * 0.5
    pw = rois[:, 2] - rois[:, 0]
    ph = rois[:, 3] - rois[:, 1]
    gw, gh = pw * dw.exp(), ph * dh.exp()
    gx, gy = px + pw * d[:, 0], py + ph * d[:, 1]
    x1 = (gx - gw * 0.5).clamp(min=0, max=max_shape[1])
    y1 = (gy - gh * 0.5).clamp(min=0, max=max_shape[0])
    x2 = (gx + gw * 0.5).clamp(min=0, max=max_shape[1])
    y2 = (gy + gh * 0.5).clamp(min=0, max=max_shape[0])
    return torch.stack([x1, y1, x2, y2], dim=-1)


def giou_loss(pred, target, eps=1e-7):
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    ap = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    ag = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    union = ap + ag - overlap + eps
    ious = overlap / union
    enclose_wh = (torch.max(pred[:, 2:], target[:, 2:]) - torch.min(pred[:, :2], target[:, :2])).clamp(min=0)
    enclose = enclose_wh[:, 0] * enclose_wh[:, 1] + eps
    gious = ious - (enclose - union) / enclose
    return (1 - gious).mean()


def iou_matrix(a, b, eps=1e-6):
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None, :] - inter + eps)


def sigmoid_focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * loss).sum() / targets.sum().clamp(min=1)


def label_smoothed_ce(logits, target, eps=0.1):
    logp = F.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, target[:, None]).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    return ((1 - eps) * nll + eps * smooth).mean()


def sequence_mask_loss(scores, lengths, max_len: int):
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    masked = scores.masked_fill(~mask, 0.0)
    return (masked * masked).sum() / mask.sum()


def gae(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(last_value)
    for t in reversed(range(T)):
        next_v = last_value if t == T - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv, adv + values


def _boxes(n, gen):
    xy = torch.rand(n, 2, generator=gen) * 50
    return torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 20 + 1], 1)


def _inputs(name, gen, n=24):
    if name in ("bbox2delta", "giou_loss"):
        return [_boxes(n, gen), _boxes(n, gen)]
    if name == "delta2bbox":
        return [_boxes(n, gen), torch.randn(n, 4, generator=gen)]
    if name == "iou_matrix":
        return [_boxes(n, gen), _boxes(n // 2, gen)]
    if name == "sigmoid_focal_loss":
        return [torch.randn(n, 5, generator=gen), (torch.rand(n, 5, generator=gen) > 0.8).float()]
    if name == "label_smoothed_ce":
        return [torch.randn(n, 7, generator=gen), torch.randint(0, 7, (n,), generator=gen)]
    if name == "sequence_mask_loss":
        return [torch.randn(n // 4, 9, generator=gen), torch.randint(1, 10, (n // 4,), generator=gen), 9]
    if name == "gae":
        t, b = 8, n // 4
        return [torch.randn(t, b, generator=gen), torch.randn(t, b, generator=gen),
                (torch.rand(t, b, generator=gen) > 0.8).float(), torch.randn(b, generator=gen)]  # fmt: skip
    raise KeyError(name)


FUNCTIONS = {f.__name__: f for f in (bbox2delta, delta2bbox, giou_loss, iou_matrix, sigmoid_focal_loss,
                                     label_smoothed_ce, sequence_mask_loss, gae)}  # fmt: skip
#: Inputs that carry gradients (float inputs the function differentiates).
DIFFERENTIABLE = {"bbox2delta": [0, 1], "delta2bbox": [0, 1], "giou_loss": [0], "iou_matrix": [0, 1],
                  "sigmoid_focal_loss": [0], "label_smoothed_ce": [0], "sequence_mask_loss": [0],
                  "gae": [0, 1, 3]}  # fmt: skip


def _compiled(entry, fn):
    if entry == "jit":
        return tailjit.jit(fn, static_argnums=(2,)) if fn is sequence_mask_loss else tailjit.jit(fn)
    torch._dynamo.reset()
    return torch.compile(fn, backend="tailjit")


def _leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("entry", ["compile", "jit"])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_forward_and_backward_match_eager(name, entry):
    fn = FUNCTIONS[name]
    gen = torch.Generator().manual_seed(1)
    args = _inputs(name, gen)
    grads = DIFFERENTIABLE[name]

    def leaves_with_grad():
        a = [x.clone().requires_grad_(i in grads) if isinstance(x, torch.Tensor) else x for i, x in enumerate(args)]
        return a, [a[i] for i in grads]

    with collect_reports() as reports:
        compiled = _compiled(entry, fn)
        with torch.no_grad():
            got, want = compiled(*args), fn(*args)
        for g, w in zip(_leaves(got), _leaves(want)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)

        a, ga = leaves_with_grad()
        b, gb = leaves_with_grad()
        out_c, out_e = _leaves(compiled(*a)), _leaves(fn(*b))
        heads = [torch.randn_like(o) for o in out_e]
        torch.autograd.backward(out_c, heads)
        torch.autograd.backward(out_e, heads)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=1e-5)

    reports = [r for r in reports if r.kind in ("inference", "training", "forward", "backward", "jit")]
    kinds = {r.kind for r in reports}
    differentiated = any("differentiated by its tensor expressions" in r.note for r in reports)
    assert ("backward" in kinds or differentiated) and ("inference" in kinds or "jit" in kinds), kinds
    fallbacks = [f"{r.kind}: {f}" for r in reports for f in r.fallbacks if "copy_" not in f.target]
    assert not fallbacks, fallbacks


def test_unrolled_recurrence_compiles_to_linear_code():
    """GAE's Python loop unrolled over T steps: each step's value is materialised once (not recomputed
    from the end of the chain at every later step) and ``advantages[t] = ...`` updates one buffer in
    place, so the compiled graph has O(T) loop nests, each reading O(1) values."""
    T = 24
    gen = torch.Generator().manual_seed(3)
    args = [torch.randn(T, 5, generator=gen), torch.randn(T, 5, generator=gen),
            (torch.rand(T, 5, generator=gen) > 0.8).float(), torch.randn(5, generator=gen)]  # fmt: skip
    f = tailjit.jit(gae)
    for got, want in zip(f(*args), gae(*args)):
        torch.testing.assert_close(got, want)
    ((kernel, _),) = f.reports[-1].kernels
    assert len(kernel.kernels) <= 3 * T + 4
    assert "the base was computed in this buffer" in kernel.describe()
    # no step inlines the whole chain behind it (kernels merged into another's loop nest included)
    assert max(len(fused) for k in kernel.kernels for fused in [k.fused, *(m[3] for m in k.merged)]) <= 20
