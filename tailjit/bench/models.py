"""The five end-to-end workloads of the TVM evaluation, written from their papers.

Each model is built from ``torch.nn`` with random weights drawn from a
``torch.Generator`` (nothing is downloaded), so a seed fixes the weights, and
is returned in ``eval()`` mode.  ``make_inputs("small", gen)`` is batch 1 (one
inference request); ``"large"`` is a training-sized batch.  ResNet-18 and the
LSTM language model are also measured forward+backward (``train=True``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """One end-to-end model of the suite."""

    name: str
    reference: str
    build: Callable[[torch.Generator], nn.Module]
    make_inputs: Callable[[str, torch.Generator], tuple]
    train: bool


def _uniform_(param: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        param.uniform_(-bound, bound, generator=gen)


def _normal_(param: torch.Tensor, mean: float, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        param.normal_(mean, std, generator=gen)


def _init_from(model: nn.Module, gen: torch.Generator, *, gan: bool = False) -> nn.Module:
    """Re-draw every parameter of ``model`` from ``gen`` and return it in eval mode.

    Convolutions and linear layers use He et al. (2015) uniform initialisation,
    LSTMs the uniform(-1/sqrt(hidden), 1/sqrt(hidden)) rule, embeddings
    uniform(-0.1, 0.1); with ``gan`` every weight is N(0, 0.02) and batch-norm
    scales N(1, 0.02), as in Radford et al. (2016).  A module type without a
    rule is an error, so no parameter keeps the global-RNG value torch gave it.
    """
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            fan_in = module.weight[0].numel()
            if gan:
                _normal_(module.weight, 0.0, 0.02, gen)
            else:
                _uniform_(module.weight, math.sqrt(6.0 / fan_in), gen)
            if module.bias is not None and gan:
                nn.init.zeros_(module.bias)
            elif module.bias is not None:
                _uniform_(module.bias, 1.0 / math.sqrt(fan_in), gen)
        elif isinstance(module, nn.BatchNorm2d):
            if gan:
                _normal_(module.weight, 1.0, 0.02, gen)
            else:
                nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            _uniform_(module.weight, 0.1, gen)
        elif isinstance(module, nn.LSTM):
            for param in own:
                _uniform_(param, 1.0 / math.sqrt(module.hidden_size), gen)
        else:
            raise TypeError(f"no initialisation rule for {type(module).__name__}")
    return model.eval()


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(cout)]


# --- ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016) ---


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, 3, stride), nn.ReLU(inplace=True), *_conv_bn(cout, cout, 3))
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet18(num_classes: int = 1000) -> nn.Module:
    """The 18-layer ResNet of the paper's Table 1: four stages of two basic blocks."""
    layers: list[nn.Module] = [
        *_conv_bn(3, 64, 7, stride=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


# --- MobileNet-v2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018) ---


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, linear 1x1 projection; residual when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(cin, hidden, 1), nn.ReLU6(inplace=True)]
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True)]
        layers += _conv_bn(hidden, cout, 1)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return x + out if self.residual else out


#: The paper's Table 2: expansion t, output channels c, repeats n, first stride s.
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(num_classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [*_conv_bn(3, 32, 3, stride=2), nn.ReLU6(inplace=True)]
    cin = 32
    for expand, cout, repeats, stride in MOBILENET_V2_STAGES:
        for i in range(repeats):
            layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
            cin = cout
    layers += [*_conv_bn(cin, 1280, 1), nn.ReLU6(inplace=True)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, num_classes)]
    return nn.Sequential(*layers)


# --- LSTM language model (Zaremba et al., "Recurrent Neural Network Regularization", 2014, medium) ---


class LSTMLanguageModel(nn.Module):
    """Token embedding, a 2-layer LSTM and a linear decoder to vocabulary logits."""

    def __init__(self, vocab: int = 10000, hidden: int = 650, layers: int = 2, dropout: float = 0.5):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(hidden, hidden, layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        return self.decoder(self.drop(out))


LSTM_VOCAB = 10000
LSTM_SEQ = 35


# --- DQN (Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015) ---


def dqn(actions: int = 18) -> nn.Module:
    """Three convolutions over 4 stacked 84x84 frames, a 512-unit layer, one Q-value per action."""
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(inplace=True),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(inplace=True),
        nn.Linear(512, actions),
    )


# --- DCGAN generator (Radford et al., "Unsupervised Representation Learning with DCGANs", ICLR 2016) ---


class DCGANGenerator(nn.Module):
    """Project 100-d noise to 4x4x1024, then four fractionally-strided convolutions to a 64x64 RGB image."""

    def __init__(self, noise: int = 100, width: int = 128):
        super().__init__()
        chans = (width * 8, width * 4, width * 2, width)
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(noise, chans[0], 4, 1, 0, bias=False),
            nn.BatchNorm2d(chans[0]),
            nn.ReLU(inplace=True),
        ]
        for cin, cout in zip(chans, chans[1:]):
            layers += [
                nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(True),
            ]
        layers += [nn.ConvTranspose2d(chans[-1], 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z[:, :, None, None])


DCGAN_NOISE = 100

#: Batch size per input size: "small" is one request, "large" a training minibatch.
BATCH = {
    "resnet18": {"small": 1, "large": 8},
    "mobilenet_v2": {"small": 1, "large": 16},
    "lstm_lm": {"small": 1, "large": 20},
    "dqn": {"small": 1, "large": 32},
    "dcgan_generator": {"small": 1, "large": 32},
}


def _batch(model: str, size: str) -> int:
    try:
        return BATCH[model][size]
    except KeyError:
        raise ValueError(f"unknown size {size!r} for {model}; expected 'small' or 'large'") from None


def _images(
    model: str, shape: tuple[int, ...], sample: Callable = torch.randn
) -> Callable[[str, torch.Generator], tuple]:
    def make(size: str, gen: torch.Generator) -> tuple:
        return (sample((_batch(model, size), *shape), generator=gen),)

    return make


def _tokens(size: str, gen: torch.Generator) -> tuple:
    return (torch.randint(0, LSTM_VOCAB, (_batch("lstm_lm", size), LSTM_SEQ), generator=gen),)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="resnet18",
            reference="He et al., Deep Residual Learning for Image Recognition, CVPR 2016 (ResNet-18)",
            build=lambda gen: _init_from(resnet18(), gen),
            make_inputs=_images("resnet18", (3, 224, 224)),
            train=True,
        ),
        ModelSpec(
            name="mobilenet_v2",
            reference="Sandler et al., MobileNetV2: Inverted Residuals and Linear Bottlenecks, CVPR 2018",
            build=lambda gen: _init_from(mobilenet_v2(), gen),
            make_inputs=_images("mobilenet_v2", (3, 224, 224)),
            train=False,
        ),
        ModelSpec(
            name="lstm_lm",
            reference="Zaremba et al., Recurrent Neural Network Regularization, 2014 (medium LSTM LM)",
            build=lambda gen: _init_from(LSTMLanguageModel(LSTM_VOCAB), gen),
            make_inputs=_tokens,
            train=True,
        ),
        ModelSpec(
            name="dqn",
            reference="Mnih et al., Human-level control through deep reinforcement learning, Nature 2015",
            build=lambda gen: _init_from(dqn(), gen),
            make_inputs=_images("dqn", (4, 84, 84), torch.rand),  # pixel intensities in [0, 1)
            train=False,
        ),
        ModelSpec(
            name="dcgan_generator",
            reference="Radford et al., Unsupervised Representation Learning with Deep Convolutional GANs, "
            "ICLR 2016 (generator)",
            build=lambda gen: _init_from(DCGANGenerator(DCGAN_NOISE), gen, gan=True),
            make_inputs=_images("dcgan_generator", (DCGAN_NOISE,)),
            train=False,
        ),
    )
}
