"""Training networks built from new operators (``tailjit bench --suite networks``).

NeoFlow's evaluation: six networks whose characteristic operator no vendor
library provides, each trained for a few steps.  Every network is written
twice from the same parameters:

* the **reference**, an ``nn.Module`` in plain eager PyTorch, with the new
  operator written as torch ops the way a paper's code does it;
* the **tailjit version**, a subclass that replaces exactly that operator by
  a tensor-expression operator defined with ``@tailjit.op``, whose gradient
  ``te.gradient`` derives (no hand-written backward).

Dense layers (``F.linear``, ``torch.mm``, ``einsum``, ``F.conv2d``) stay torch
ops in both versions: MKL and oneDNN are the right tool for them, and the
comparison is about the operator around them.  The subclass shares the
reference's parameters, so ``load_state_dict`` copies one into the other.

:func:`train` runs a few SGD steps and returns the losses; :func:`measure`
times one training step (forward, backward, optimizer step) of each variant
with :func:`tailjit.bench.timing.interleaved` and checks every variant's loss
curve against eager PyTorch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import tailjit
from tailjit import te
from tailjit.bench.timing import interleaved

# --- initialisation -------------------------------------------------------------------------------


def _uniform_all(module: nn.Module, gen: torch.Generator, bound: float, skip=()) -> None:
    """Every parameter (in ``named_parameters`` order, except ``skip``) uniform in [-bound, bound]."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name not in skip:
                p.uniform_(-bound, bound, generator=gen)


def _he_uniform(module: nn.Module, gen: torch.Generator) -> None:
    """Convolutions and linear layers: He et al. (2015) uniform weights, biases in 1/sqrt(fan_in)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.uniform_(-math.sqrt(6.0 / fan_in), math.sqrt(6.0 / fan_in), generator=gen)
                if m.bias is not None:
                    m.bias.uniform_(-1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in), generator=gen)


# --- recurrent networks ---------------------------------------------------------------------------


class _Recurrent(nn.Module):
    """A cell run over a sequence ``x`` of shape (T, B, input), then a linear classifier on the last
    hidden state.  Subclasses define ``state(x)`` (the initial state, zeros) and ``cell``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__} expects a (time, batch, features) sequence, got {tuple(x.shape)}")
        return self.head(self.run(x))

    def run(self, x: torch.Tensor) -> tuple:
        """The state after the last step."""
        state = self.state(x)
        for t in range(x.shape[0]):
            state = self.cell(x[t], *state)
        return state

    def head(self, state: tuple) -> torch.Tensor:
        return self.out(state[0])

    def zeros(self, x: torch.Tensor, size: int) -> torch.Tensor:
        return x.new_zeros(x.shape[1], size)


# LLTM -----------------------------------------------------------------------------------------------


@tailjit.op
def lltm_cell(gates, cell):
    """LLTM's gates and state update, from the gate pre-activations (B, 3, H): input, output, candidate."""
    n, h = cell.shape

    def new_cell(i, j):
        z = gates[i, 2, j]
        elu = te.select(z > 0, z, te.expm1(z))
        return cell[i, j] + elu * te.sigmoid(gates[i, 0, j])

    c = te.compute((n, h), new_cell, name="new_cell")
    hid = te.compute((n, h), lambda i, j: te.tanh(c[i, j]) * te.sigmoid(gates[i, 1, j]), name="new_h")
    return hid, c


class _GatedCell(_Recurrent):
    """A cell whose ``GATES`` gate pre-activations are one linear layer over ``[h, x]``, with state
    ``(h, c)``."""

    GATES: int

    def __init__(self, input_size: int = 32, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.hidden = hidden
        self.weights = nn.Parameter(torch.empty(self.GATES * hidden, input_size + hidden))
        self.bias = nn.Parameter(torch.empty(self.GATES * hidden))
        self.out = nn.Linear(hidden, classes)

    def reset_parameters(self, gen: torch.Generator) -> None:
        _uniform_all(self, gen, 1.0 / math.sqrt(self.hidden))  # the LLTM tutorial's rule

    def state(self, x):
        return self.zeros(x, self.hidden), self.zeros(x, self.hidden)

    def preactivations(self, x, h):
        """(B, GATES * H)."""
        return F.linear(torch.cat([h, x], 1), self.weights, self.bias)


class LLTM(_GatedCell):
    """The LLTM cell of the PyTorch C++/CUDA extension tutorial ("Custom C++ and CUDA Extensions",
    pytorch.org/tutorials/advanced/cpp_extension): one linear layer over ``[h, x]`` gives an input
    gate, an output gate (sigmoids) and a candidate cell (ELU); ``c' = c + candidate * input_gate``,
    ``h' = tanh(c') * output_gate``."""

    GATES = 3

    def cell(self, x, h, c):
        gates = self.preactivations(x, h).chunk(3, dim=1)
        input_gate, output_gate = torch.sigmoid(gates[0]), torch.sigmoid(gates[1])
        candidate = F.elu(gates[2])
        c = c + candidate * input_gate
        return torch.tanh(c) * output_gate, c


class LLTMTailjit(LLTM):
    def cell(self, x, h, c):
        return lltm_cell(self.preactivations(x, h).view(-1, 3, self.hidden), c)


# MI-LSTM --------------------------------------------------------------------------------------------


@tailjit.op
def mi_preactivation(wx, uh, alpha, beta1, beta2, bias):
    """Multiplicative integration: ``alpha * Wx * Uh + beta1 * Uh + beta2 * Wx + b`` (B, 4H)."""
    n, m = wx.shape
    return te.compute(
        (n, m),
        lambda i, k: alpha[k] * wx[i, k] * uh[i, k] + beta1[k] * uh[i, k] + beta2[k] * wx[i, k] + bias[k],
        name="preactivation",
    )


@tailjit.op
def lstm_cell(gates, cell):
    """The LSTM state update from the gates' pre-activations (B, 4, H): input, forget, output, candidate."""
    n, h = cell.shape
    c = te.compute(
        (n, h),
        lambda i, j: te.sigmoid(gates[i, 1, j]) * cell[i, j] + te.sigmoid(gates[i, 0, j]) * te.tanh(gates[i, 3, j]),
        name="new_cell",
    )
    hid = te.compute((n, h), lambda i, j: te.sigmoid(gates[i, 2, j]) * te.tanh(c[i, j]), name="new_h")
    return hid, c


class MILSTM(_Recurrent):
    """LSTM with multiplicative integration (Wu, Zhang, Zhang, Bengio, Salakhutdinov, "On
    Multiplicative Integration with Recurrent Neural Networks", NeurIPS 2016, section 4): every
    gate's pre-activation is ``alpha * Wx * Uh + beta1 * Uh + beta2 * Wx + b`` (element-wise
    products) instead of ``Wx + Uh + b``."""

    def __init__(self, input_size: int = 32, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.hidden = hidden
        self.W = nn.Parameter(torch.empty(input_size, 4 * hidden))
        self.U = nn.Parameter(torch.empty(hidden, 4 * hidden))
        self.alpha = nn.Parameter(torch.empty(4 * hidden))
        self.beta1 = nn.Parameter(torch.empty(4 * hidden))
        self.beta2 = nn.Parameter(torch.empty(4 * hidden))
        self.bias = nn.Parameter(torch.empty(4 * hidden))
        self.out = nn.Linear(hidden, classes)

    def reset_parameters(self, gen: torch.Generator) -> None:
        _uniform_all(self, gen, 1.0 / math.sqrt(self.hidden), skip=("alpha", "beta1", "beta2"))
        with torch.no_grad():  # the gating vectors start near the paper's alpha = 1, beta = 0.5
            self.alpha.uniform_(0.9, 1.1, generator=gen)
            self.beta1.uniform_(0.4, 0.6, generator=gen)
            self.beta2.uniform_(0.4, 0.6, generator=gen)

    def state(self, x):
        return self.zeros(x, self.hidden), self.zeros(x, self.hidden)

    def cell(self, x, h, c):
        wx, uh = x @ self.W, h @ self.U
        pre = self.alpha * wx * uh + self.beta1 * uh + self.beta2 * wx + self.bias
        i, f, o, z = pre.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(z)
        return torch.sigmoid(o) * torch.tanh(c), c


class MILSTMTailjit(MILSTM):
    def cell(self, x, h, c):
        # two operators: the pre-activations (whose parameter gradients are column sums of the
        # incoming gradient) and the state update.  As one operator, each of the 16 per-gate
        # parameter gradients re-derived the state update's adjoint (its sigmoids and tanhs)
        # inside its column sum, which made the backward several times slower than eager.
        pre = mi_preactivation(x @ self.W, h @ self.U, self.alpha, self.beta1, self.beta2, self.bias)
        return lstm_cell(pre.view(-1, 4, self.hidden), c)


# SCRNN ----------------------------------------------------------------------------------------------


@tailjit.op
def scrnn_context(xb, alpha):
    """SCRNN's context units over a whole sequence: ``s[t] = (1 - alpha) * xb[t] + alpha * s[t-1]``,
    one ``te.scan`` along time (``xb``: (T, B, S) projections; ``alpha`` static)."""
    return te.scan(xb.shape, 0, lambda prev, t, b, j: (1 - alpha) * xb[t, b, j] + alpha * prev,
                   initial=0.0, dtype=xb.dtype, name="context")  # fmt: skip


class SCRNN(_Recurrent):
    """Structurally constrained recurrent network (Mikolov, Joulin, Chopra, Mathieu, Ranzato,
    "Learning Longer Memory in Recurrent Neural Networks", ICLR 2015 workshop, section 3): slow
    context units ``s_t = (1 - alpha) B x_t + alpha s_{t-1}`` (alpha fixed at 0.95) beside a
    sigmoid hidden layer ``h_t = sigmoid(P s_t + A x_t + R h_{t-1})``; the output reads both."""

    def __init__(self, input_size: int = 32, hidden: int = 128, context: int = 64, classes: int = 10,
                 alpha: float = 0.95):  # fmt: skip
        super().__init__()
        self.hidden, self.context_size, self.alpha = hidden, context, alpha
        self.B = nn.Parameter(torch.empty(input_size, context))
        self.A = nn.Parameter(torch.empty(input_size, hidden))
        self.P = nn.Parameter(torch.empty(context, hidden))
        self.R = nn.Parameter(torch.empty(hidden, hidden))
        self.out = nn.Linear(hidden + context, classes)

    def reset_parameters(self, gen: torch.Generator) -> None:
        _uniform_all(self, gen, 1.0 / math.sqrt(self.hidden))

    def state(self, x):
        return self.zeros(x, self.hidden), self.zeros(x, self.context_size)

    def cell(self, x, h, s):
        s = (1 - self.alpha) * (x @ self.B) + self.alpha * s
        return torch.sigmoid(s @ self.P + x @ self.A + h @ self.R), s

    def head(self, state):
        return self.out(torch.cat(state, 1))


class SCRNNTailjit(SCRNN):
    def run(self, x):
        steps = x.shape[0]
        # the context units do not depend on h: one scan over the whole sequence, so their input
        # projection and their contribution P s_t to the hidden layer are one matrix product each
        s = scrnn_context((x @ self.B), self.alpha)
        pre = s @ self.P + x @ self.A
        h = self.zeros(x, self.hidden)
        for t in range(steps):
            h = torch.sigmoid(torch.addmm(pre[t], h, self.R))
        return h, s[steps - 1]


# subLSTM --------------------------------------------------------------------------------------------


@tailjit.op
def sublstm_cell(gates, cell):
    """subLSTM's state update from the gates' pre-activations (B, 4, H): z, i, f, o."""
    n, h = cell.shape

    def gate(k):
        return lambda i, j: te.sigmoid(gates[i, k, j])

    z, ig, f, o = (gate(k) for k in range(4))
    c = te.compute((n, h), lambda i, j: cell[i, j] * f(i, j) + z(i, j) - ig(i, j), name="new_cell")
    hid = te.compute((n, h), lambda i, j: te.sigmoid(c[i, j]) - o(i, j), name="new_h")
    return hid, c


class SubLSTM(_GatedCell):
    """Subtractive-gating LSTM (Costa, Assael, Shillingford, de Freitas, Vogels, "Cortical
    microcircuits as gated-recurrent neural networks", NeurIPS 2017, eq. 2-4): all four gates are
    sigmoids of ``W x + R h + b``; ``c' = c * f + z - i`` and ``h' = sigmoid(c') - o``."""

    GATES = 4

    def cell(self, x, h, c):
        gates = torch.sigmoid(self.preactivations(x, h))
        z, i, f, o = gates.chunk(4, dim=1)
        c = c * f + z - i
        return torch.sigmoid(c) - o, c


class SubLSTMTailjit(SubLSTM):
    def cell(self, x, h, c):
        return sublstm_cell(self.preactivations(x, h).view(-1, 4, self.hidden), c)


# --- capsule network --------------------------------------------------------------------------------

SQUASH_EPS = 1e-8


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``|s|^2 / (1 + |s|^2) * s / |s|`` (Sabour et al., eq. 1), with ``|s| = sqrt(|s|^2 + eps)``."""
    sq = (s * s).sum(dim, keepdim=True)
    return sq / (1 + sq) * s / torch.sqrt(sq + SQUASH_EPS)


def _te_squash(s: te.Tensor, name: str) -> te.Tensor:
    """Squash along the last axis of a 3-d compute or placeholder."""
    a, b, d = s.shape
    k = te.reduce_axis(d, "k")
    sq = te.compute((a, b), lambda i, j: te.sum(s[i, j, k] * s[i, j, k], axis=k), name=f"{name}_sq")
    return te.compute(
        (a, b, d),
        lambda i, j, e: sq[i, j] / (1 + sq[i, j]) * s[i, j, e] / te.sqrt(sq[i, j] + SQUASH_EPS),
        name=name,
    )


@tailjit.op
def capsule_squash(s):
    """The squash non-linearity of (B, N, D) capsules."""
    return _te_squash(s, "squash")


def _te_softmax(logits: te.Tensor, it: int) -> te.Tensor:
    """Softmax over the last axis of (B, I, J) logits."""
    nb, ni, nj = logits.shape
    k = te.reduce_axis(nj, "k")
    # the result does not depend on the maximum it subtracts: no gradient through it, as in torch's softmax
    mx = te.stop_gradient(te.compute((nb, ni), lambda b, i: te.max(logits[b, i, k], axis=k), name=f"mx{it}"))
    e = te.compute((nb, ni, nj), lambda b, i, j: te.exp(logits[b, i, j] - mx[b, i]), name=f"e{it}")
    tot = te.compute((nb, ni), lambda b, i: te.sum(e[b, i, k], axis=k), name=f"tot{it}")
    return te.compute((nb, ni, nj), lambda b, i, j: e[b, i, j] / tot[b, i], name=f"c{it}")


def _te_weighted_sum(c: te.Tensor, u_hat: te.Tensor, it: int) -> te.Tensor:
    """s[b, j, :] = sum_i c[b, i, j] u_hat[b, i, j, :]"""
    nb, ni, nj, nd = u_hat.shape
    r = te.reduce_axis(ni, "r")
    return te.compute((nb, nj, nd), lambda b, j, d: te.sum(c[b, r, j] * u_hat[b, r, j, d], axis=r), name=f"s{it}")


def _te_agreement(u_hat: te.Tensor, v: te.Tensor, it: int) -> te.Tensor:
    """a[b, i, j] = u_hat[b, i, j, :] . v[b, j, :]"""
    nb, ni, nj, nd = u_hat.shape
    q = te.reduce_axis(nd, "q")
    return te.compute((nb, ni, nj), lambda b, i, j: te.sum(u_hat[b, i, j, q] * v[b, j, q], axis=q), name=f"agree{it}")


@tailjit.op
def capsule_routing(u_hat, iterations):
    """Routing by agreement (Sabour et al., Procedure 1) over predictions ``u_hat`` (B, I, J, D):
    ``iterations`` rounds of coupling softmax, weighted sum, squash and agreement, unrolled."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"capsule_routing: iterations must be a positive int, got {iterations!r}")
    nb, ni, nj, nd = u_hat.shape
    dt = u_hat.dtype
    # softmax of the zero logits of the first round: a uniform coupling
    c = te.compute((nb, ni, nj), lambda b, i, j: te.cast(1, dt) / te.cast(nj, dt), name="c0")
    logits = None
    for it in range(iterations):
        if it > 0:
            c = _te_softmax(logits, it)
        v = _te_squash(_te_weighted_sum(c, u_hat, it), f"v{it}")
        if it < iterations - 1:
            agree = _te_agreement(u_hat, v, it)
            logits = agree if logits is None else _te_add(logits, agree, f"b{it + 1}")
    return v


def _te_add(a: te.Tensor, b: te.Tensor, name: str) -> te.Tensor:
    return te.compute(a.shape, lambda *i: a[i] + b[i], name=name)


class CapsuleNet(nn.Module):
    """CapsNet with dynamic routing (Sabour, Frosst, Hinton, "Dynamic Routing Between Capsules",
    NeurIPS 2017), scaled down: a 9x9 ReLU convolution, a 9x9 stride-2 convolution giving
    ``primary_types`` grids of ``primary_dim``-d capsules (squashed), predictions ``W_ij u_i`` for
    ``classes`` ``digit_dim``-d capsules, ``iterations`` rounds of routing by agreement; the class
    scores are the output capsules' lengths (margin loss; the reconstruction decoder is left out)."""

    def __init__(self, image: int = 28, conv_channels: int = 32, primary_types: int = 8, primary_dim: int = 8,
                 classes: int = 10, digit_dim: int = 16, iterations: int = 3):  # fmt: skip
        super().__init__()
        self.primary_types, self.primary_dim, self.iterations = primary_types, primary_dim, iterations
        self.grid = (image - 8 - 9) // 2 + 1
        if self.grid < 1:
            raise ValueError(f"CapsuleNet: image size {image} is too small for two 9x9 convolutions (needs >= 17)")
        self.conv1 = nn.Conv2d(1, conv_channels, 9)
        self.primary = nn.Conv2d(conv_channels, primary_types * primary_dim, 9, stride=2)
        n_in = primary_types * self.grid * self.grid
        self.W = nn.Parameter(torch.empty(n_in, classes, digit_dim, primary_dim))

    def reset_parameters(self, gen: torch.Generator) -> None:
        _he_uniform(self, gen)
        with torch.no_grad():  # small predictions, so that the output capsules start short
            self.W.normal_(0.0, 0.05, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 1:
            raise ValueError(f"CapsuleNet expects (B, 1, H, W) images, got {tuple(x.shape)}")
        u = self.primary(F.relu(self.conv1(x)))
        n, g = u.shape[0], self.grid
        u = u.view(n, self.primary_types, self.primary_dim, g, g).permute(0, 1, 3, 4, 2)
        u = self.squash(u.reshape(n, -1, self.primary_dim))
        u_hat = torch.einsum("ijdk,bik->bijd", self.W, u)  # (B, I, J, D) predictions
        v = self.route(u_hat)
        return torch.sqrt((v * v).sum(-1))  # capsule lengths: the class scores

    def squash(self, u):
        return squash(u)

    def route(self, u_hat):
        logits = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype)
        for it in range(self.iterations):
            c = torch.softmax(logits, dim=2)
            v = squash((c.unsqueeze(-1) * u_hat).sum(1))
            if it < self.iterations - 1:
                logits = logits + (u_hat * v.unsqueeze(1)).sum(-1)
        return v


class CapsuleNetTailjit(CapsuleNet):
    def squash(self, u):
        return capsule_squash(u)

    def route(self, u_hat):
        return capsule_routing(u_hat, self.iterations)


def margin_loss(lengths: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sabour et al., eq. 4: m+ = 0.9, m- = 0.1, lambda = 0.5; summed over classes, mean over batch."""
    t = F.one_hot(target, lengths.shape[1]).to(lengths.dtype)
    loss = t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2
    return loss.sum(1).mean()


# --- shift convolutions -----------------------------------------------------------------------------

#: The nine shifts of a 3x3 neighbourhood: channel c reads its input at (i + dh, j + dw), with
#: (dh, dw) = SHIFTS[c % 9].  The paper splits the channels into nine groups; which channels form a
#: group does not matter (the 1x1 convolutions around the shift mix them), and interleaved groups
#: keep the group test a modulo by a constant (contiguous groups, c * 9 // C, divide by a size at
#: every element: backward 32 ms against 3.5 ms on 16x64x32x32).
SHIFTS = tuple((dh, dw) for dh in (-1, 0, 1) for dw in (-1, 0, 1))


def shift(x: torch.Tensor) -> torch.Tensor:
    """Wu et al.'s shift in PyTorch: each group of channels moved by its SHIFTS entry, zero fill."""
    out = torch.zeros_like(x)
    _, _, h, w = x.shape
    for g, (dh, dw) in enumerate(SHIFTS):
        out[:, g::9, max(0, -dh) : h - max(0, dh), max(0, -dw) : w - max(0, dw)] = x[
            :, g::9, max(0, dh) : h + min(0, dh), max(0, dw) : w + min(0, dw)
        ]
    return out


@tailjit.op
def relu_shift(x):
    """ReLU then shift, one loop nest: out[b, c, i, j] = relu(x[b, c, i + dh, j + dw]) for c's shift."""
    n, c, h, w = x.shape

    def body(b, ch, i, j):
        # a sum of nine mutually exclusive terms rather than a chain of selects: each term's
        # gradient is then one guarded gather, not one conditioned on all the terms before it
        # (backward 3.5 ms against 9.3 ms on 16x64x32x32)
        out = None
        for g, (dh, dw) in enumerate(SHIFTS):
            hi, wj = i + dh, j + dw
            v = x[b, ch, hi, wj]
            inside = (ch % 9 == g) & (hi >= 0) & (hi < h) & (wj >= 0) & (wj < w)
            term = te.select(inside, te.select(v > 0, v, 0.0), 0.0)
            out = term if out is None else out + term
        return out

    return te.compute((n, c, h, w), body, name="relu_shift")


class ShiftNet(nn.Module):
    """A small ShiftResNet (Wu, Wan, Yue, Jin, Zhao, Golmant, Gholaminejad, Gonzalez, Keutzer, "Shift:
    A Zero FLOP, Zero Parameter Alternative to Spatial Convolutions", CVPR 2018): a 3x3 stem, then
    ``blocks`` residual shift modules (1x1 expansion, ReLU, shift, 1x1 projection; batch norm left
    out), global average pooling and a linear classifier."""

    def __init__(self, channels: int = 32, expansion: int = 2, blocks: int = 2, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.expand = nn.ModuleList(nn.Conv2d(channels, channels * expansion, 1) for _ in range(blocks))
        self.project = nn.ModuleList(nn.Conv2d(channels * expansion, channels, 1) for _ in range(blocks))
        self.fc = nn.Linear(channels, classes)

    def reset_parameters(self, gen: torch.Generator) -> None:
        _he_uniform(self, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"ShiftNet expects (B, 3, H, W) images, got {tuple(x.shape)}")
        x = F.relu(self.stem(x))
        for expand, project in zip(self.expand, self.project):
            x = F.relu(x + project(self.relu_shift(expand(x))))
        return self.fc(x.mean((2, 3)))

    def relu_shift(self, x):
        return shift(F.relu(x))


class ShiftNetTailjit(ShiftNet):
    def relu_shift(self, x):
        return relu_shift(x)


# --- the suite --------------------------------------------------------------------------------------


def _sequence_batch(gen, dtype, cfg):
    x = torch.randn(cfg["seq_len"], cfg["batch"], cfg["input_size"], generator=gen, dtype=dtype)
    return x, torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen)


def _image_batch(channels):
    def make(gen, dtype, cfg):
        x = torch.randn(cfg["batch"], channels, cfg["image"], cfg["image"], generator=gen, dtype=dtype)
        return x, torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen)

    return make


@dataclass(frozen=True)
class Network:
    """One network of the suite: its two versions, its data, its loss and its TE operators."""

    name: str
    reference: type[nn.Module]
    tailjit: type[nn.Module]
    config: dict  # sizes: constructor arguments plus "batch" (and "seq_len", a sequence's length)
    make_batch: Callable  # (generator, dtype, config) -> (inputs, targets)
    loss: Callable  # (outputs, targets) -> scalar
    ops: tuple  # the @tailjit.op operators the tailjit version calls
    lr: float = 0.05
    model_keys: tuple = field(default=())  # config keys passed to the constructor

    def sizes(self, **overrides) -> dict:
        unknown = set(overrides) - set(self.config)
        if unknown:
            raise ValueError(f"network {self.name!r}: unknown sizes {sorted(unknown)}; it has {sorted(self.config)}")
        return {**self.config, **overrides}


def _rnn(name, ref, tj, ops, **extra):
    cfg = {"seq_len": 16, "batch": 32, "input_size": 32, "hidden": 128, **extra, "classes": 10}
    keys = tuple(k for k in cfg if k not in ("seq_len", "batch"))
    return Network(name, ref, tj, cfg, _sequence_batch, F.cross_entropy, ops, 0.05, keys)


NETWORKS: dict[str, Network] = {
    n.name: n
    for n in (
        Network("capsule", CapsuleNet, CapsuleNetTailjit,
                {"batch": 16, "image": 28, "conv_channels": 32, "primary_types": 8, "primary_dim": 8,
                 "classes": 10, "digit_dim": 16, "iterations": 3},
                _image_batch(1), margin_loss, (capsule_squash, capsule_routing), 0.05,
                ("image", "conv_channels", "primary_types", "primary_dim", "classes", "digit_dim", "iterations")),
        _rnn("lltm", LLTM, LLTMTailjit, (lltm_cell,)),
        _rnn("mi_lstm", MILSTM, MILSTMTailjit, (mi_preactivation, lstm_cell)),
        _rnn("scrnn", SCRNN, SCRNNTailjit, (scrnn_context,), context=64),
        _rnn("sublstm", SubLSTM, SubLSTMTailjit, (sublstm_cell,)),
        Network("shift", ShiftNet, ShiftNetTailjit,
                {"batch": 16, "image": 32, "channels": 32, "expansion": 2, "blocks": 2, "classes": 10},
                _image_batch(3), F.cross_entropy, (relu_shift,), 0.05,
                ("channels", "expansion", "blocks", "classes")),
    )
}  # fmt: skip


def build(net: Network, seed: int = 0, dtype: torch.dtype = torch.float32, **sizes) -> tuple[nn.Module, nn.Module]:
    """The reference and the tailjit version with the same parameters (drawn from ``seed``)."""
    cfg = net.sizes(**sizes)
    args = {k: cfg[k] for k in net.model_keys}
    ref = net.reference(**args)
    ref.reset_parameters(torch.Generator().manual_seed(seed))
    ref = ref.to(dtype)
    ours = net.tailjit(**args).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def make_data(net: Network, batches: int, seed: int = 0, dtype: torch.dtype = torch.float32, **sizes) -> list:
    """``batches`` fixed (inputs, targets) pairs drawn from ``seed``."""
    cfg = net.sizes(**sizes)
    gen = torch.Generator().manual_seed(seed + 1)
    return [net.make_batch(gen, dtype, cfg) for _ in range(batches)]


def train_step(model: nn.Module, net: Network, opt: torch.optim.Optimizer, batch) -> torch.Tensor:
    """One step: forward, loss, backward, optimizer step; returns the loss (a tensor, not synced)."""
    x, y = batch
    loss = net.loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def optimizer(model: nn.Module, net: Network) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=net.lr, momentum=0.9)


def train(model: nn.Module, net: Network, data: list, steps: int) -> list[float]:
    """``steps`` SGD steps (momentum 0.9) cycling through ``data``; the loss before each step."""
    opt = optimizer(model, net)
    return [float(train_step(model, net, opt, data[s % len(data)])) for s in range(steps)]


# --- measurement ------------------------------------------------------------------------------------

#: eager: the reference; inductor: torch.compile(reference); tailjit: the tailjit version run eagerly
#: (its operators called from Python); tailjit+compile / tailjit+inductor: torch.compile(tailjit
#: version) with the tailjit or the Inductor backend, where each operator is one opaque custom op;
#: tailjit+jit: tailjit.jit(tailjit version), its parameters inputs of one trace per signature; jit:
#: tailjit.jit(reference), the plain network compiled by tailjit as Inductor compiles it.
VARIANTS = ("eager", "inductor", "tailjit", "tailjit+compile", "tailjit+inductor", "tailjit+jit", "jit")


def _variant_model(variant: str, ref: nn.Module, ours: nn.Module) -> nn.Module:
    import copy

    if variant == "eager":
        return copy.deepcopy(ref)
    if variant == "inductor":  # standard usage: compile the model, the training loop stays Python
        return torch.compile(copy.deepcopy(ref), backend="inductor")
    if variant == "tailjit":
        return copy.deepcopy(ours)
    if variant == "tailjit+compile":  # the TE ops are opaque custom ops; the rest goes to tailjit's backend
        return torch.compile(copy.deepcopy(ours), backend="tailjit")
    if variant == "tailjit+inductor":  # the TE ops are opaque custom ops; the rest goes to Inductor
        return torch.compile(copy.deepcopy(ours), backend="inductor")
    if variant in ("tailjit+jit", "jit"):  # a JitModule: parameters() and train() are the module's
        return tailjit.jit(copy.deepcopy(ours if variant == "tailjit+jit" else ref))
    raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


_COMPILED = ("inductor", "tailjit+compile", "tailjit+inductor")


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def measure_network(net: Network, variants=VARIANTS, steps: int = 5, repeats: int = 7, seed: int = 0,
                    batch_s: float = 0.2, **sizes) -> dict:  # fmt: skip
    """Loss curves, first-step and steady-state step times of each variant of ``net``."""
    # the recurrent networks share one forward code object: without a reset, Dynamo's compile
    # cache for it fills up over the suite and later networks would silently run eagerly
    torch._dynamo.reset()
    ref, ours = build(net, seed, **sizes)
    data = make_data(net, steps, seed, **sizes)
    row: dict = {"network": net.name, "sizes": net.sizes(**sizes), "variants": {}}
    runners = {}
    curves = {}
    for variant in variants:
        entry: dict = {}
        row["variants"][variant] = entry
        try:
            model = _variant_model(variant, ref, ours)
            opt = optimizer(model, net)
            graphs = _graphs_compiled()
            start = time.perf_counter()
            first = float(train_step(model, net, opt, data[0]))
            entry["first_step_s"] = time.perf_counter() - start
            if variant in _COMPILED and _graphs_compiled() == graphs:
                raise RuntimeError("torch.compile captured no graph: the variant would run eagerly")
            curve = [first] + [float(train_step(model, net, opt, data[s % len(data)])) for s in range(1, steps)]
        except Exception as exc:  # a variant that fails is reported, the others still run
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            continue
        curves[variant] = curve
        entry["losses"] = curve
        runners[variant] = lambda m=model, o=opt, b=data[0]: train_step(m, net, o, b)
    if "eager" in curves:
        want = torch.tensor(curves["eager"], dtype=torch.float64)
        for variant, curve in curves.items():
            got = torch.tensor(curve, dtype=torch.float64)
            row["variants"][variant]["max_rel_loss_diff"] = float(((got - want).abs() / want.abs()).max())
    if runners:
        timings = interleaved(runners, repeats=repeats, batch_s=batch_s, warmup=1)
        for variant, t in timings.items():
            row["variants"][variant]["step_s"] = t.median
            row["variants"][variant]["spread"] = t.spread
    return row


def measure(names=None, variants=VARIANTS, threads: int = 1, steps: int = 5, repeats: int = 7,
            seed: int = 0, progress: Callable | None = None) -> list[dict]:  # fmt: skip
    torch.set_num_threads(threads)
    names = list(names or NETWORKS)
    unknown = [n for n in names if n not in NETWORKS]
    if unknown:
        raise ValueError(f"unknown networks {unknown}; choose from {', '.join(NETWORKS)}")
    rows = []
    for name in names:
        if progress:
            progress(name)
        rows.append(measure_network(NETWORKS[name], variants, steps, repeats, seed))
    return rows


LOSS_RTOL = 1e-3  # float32 loss curves over a few steps; a wrong gradient is off by far more


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def report(rows: list[dict], threads: int, console) -> None:
    """Two tables: time per training step (and speedup over eager), and the first step's time."""
    from rich.table import Table

    steady = Table(title=f"time per training step, ms, and speedup over eager (medians of interleaved "
                   f"repetitions, {threads} thread(s))")  # fmt: skip
    first = Table(title="first training step, s (includes every compile; caches cold)")
    for t in (steady, first):
        t.add_column("network")
        for v in VARIANTS:
            t.add_column(v, justify="right")
    steady.add_column("loss curves")
    speedups: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in rows:
        vs = r["variants"]
        eager = vs.get("eager", {}).get("step_s")
        cells, firsts, bad = [], [], []
        for v in VARIANTS:
            e = vs.get(v)
            if e is None or "error" in e:
                cells.append("-" if e is None else "[red]failed[/]")
                firsts.append("-")
                continue
            firsts.append(f"{e['first_step_s']:.1f}")
            if "step_s" not in e:
                cells.append("-")
                continue
            sp = eager / e["step_s"] if eager else None
            if sp:
                speedups[v].append(sp)
            cells.append(f"{e['step_s'] * 1e3:.2f}" + (f" ({sp:.2f}x)" if sp and v != "eager" else ""))
            if e.get("max_rel_loss_diff", 0.0) > LOSS_RTOL:
                bad.append(f"{v} {e['max_rel_loss_diff']:.1e}")
        steady.add_row(r["network"], *cells, "[red]differ: " + ", ".join(bad) + "[/]" if bad else "match eager")
        first.add_row(r["network"], *firsts)
    steady.add_row(
        "geomean", *(f"{geomean(s):.2f}x" if s and len(s) == len(rows) else "-" for s in speedups.values()), ""
    )
    console.print(steady)
    console.print(first)
    for r in rows:
        for v, e in r["variants"].items():
            if "error" in e:
                console.print(f"[red]{r['network']} / {v}: {e['error']}[/]")


def main(args) -> int:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # logs and pipes: do not squeeze the tables to 80 columns
        console.width = max(console.width, 140)
    threads = getattr(args, "threads", None) or 1
    names = [n.strip() for n in (getattr(args, "ops", None) or "").split(",") if n.strip()] or None
    # cold compiles: first-step times include every build, nothing cached by an earlier run
    tmp = tempfile.mkdtemp(prefix="tailjit-networks-")
    saved = {k: os.environ.get(k) for k in ("TAILJIT_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    os.environ["TAILJIT_CACHE_DIR"] = os.path.join(tmp, "tailjit")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    try:
        rows = measure(names, threads=threads, repeats=11 if getattr(args, "full", False) else 7,
                       progress=lambda n: console.print(f"measuring {n} ..."))  # fmt: skip
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)  # loaded kernels stay mapped; nothing reads the files again
    report(rows, threads, console)
    path = getattr(args, "json", None)
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=2)
        console.print(f"wrote {path}")
    return 0
