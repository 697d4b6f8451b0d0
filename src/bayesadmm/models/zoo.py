"""The architectures of the experiments, each a factory returning a ``FlatModel``.

Every factory passes the FlatModel a ``functools.partial`` of a module-level builder rather than a lambda, so models
stay picklable (worker processes receive them).  A new architecture is one builder, one factory and one entry in
``MODELS``; inputs are images ``(N, ...)`` and outputs logits ``(N, num_classes)``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor, nn
from torch.nn import functional as F

from .functional import FlatModel

__all__ = ["MODELS", "make_model", "mlp", "small_mlp", "logistic", "zenke_cnn", "acar_cnn", "resnet20"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}


def _build_mlp(in_features: int, hidden: tuple[int, ...], num_classes: int, activation: str) -> nn.Module:
    widths = (in_features, *hidden)
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), _ACTIVATIONS[activation]()]
    layers.append(nn.Linear(widths[-1], num_classes))
    return nn.Sequential(*layers)


def mlp(
    in_features: int = 784,
    hidden: tuple[int, ...] = (200, 100),
    num_classes: int = 10,
    activation: str = "sigmoid",
) -> FlatModel:
    """Fully connected network ``in_features → hidden… → num_classes`` on flattened inputs.

    The defaults are the papers' MLP 784-200-100-10 with sigmoid activations (178 110 parameters).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(sorted(_ACTIVATIONS))}")
    return FlatModel(partial(_build_mlp, in_features, tuple(hidden), num_classes, activation))


def small_mlp(in_features: int = 10, num_classes: int = 1, hidden: int = 50) -> FlatModel:
    """One hidden layer of ``hidden`` tanh units, ``in_features → hidden → num_classes``: for tabular data such as
    the diabetes set (10 features, one regression output: 601 parameters)."""
    return mlp(in_features, (hidden,), num_classes, "tanh")


def _build_logistic(in_features: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


def logistic(in_features: int = 784, num_classes: int = 10) -> FlatModel:
    """Multiclass logistic (softmax) regression: logits ``W x + b`` on flattened inputs."""
    return FlatModel(partial(_build_logistic, in_features, num_classes))


def _check_image_args(num_classes: int, in_channels: int) -> None:
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be positive, got {in_channels}")


def _build_zenke_cnn(num_classes: int, in_channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding="same"),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding="same"),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 6 * 6, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def zenke_cnn(num_classes: int = 10, in_channels: int = 3) -> FlatModel:
    """The CIFAR-10 CNN of Zenke et al. (2017), as used by FedLap, for ``(N, in_channels, 32, 32)`` inputs.

    ``conv3×3-32 (same) → ReLU → conv3×3-32 (valid) → ReLU → maxpool 2`` (32 → 30 → 15),
    ``conv3×3-64 (same) → ReLU → conv3×3-64 (valid) → ReLU → maxpool 2`` (15 → 13 → 6),
    ``flatten (64·6·6 = 2304) → FC 512 → ReLU → FC num_classes``; 1 250 858 parameters for 10 classes and 3
    input channels.  The original's dropout layers (0.25, 0.25, 0.5) are left out: a ``FlatModel`` always
    evaluates its template in eval mode, where dropout is the identity, so they would be a no-op during training too.
    The model does not normalise its inputs.
    """
    _check_image_args(num_classes, in_channels)
    return FlatModel(partial(_build_zenke_cnn, num_classes, in_channels))


def _build_acar_cnn(num_classes: int, in_channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 5 * 5, 384),
        nn.ReLU(),
        nn.Linear(384, 192),
        nn.ReLU(),
        nn.Linear(192, num_classes),
    )


def acar_cnn(num_classes: int = 10, in_channels: int = 3) -> FlatModel:
    """The CIFAR CNN of Acar et al. (2021, FedDyn) for ``(N, in_channels, 32, 32)`` inputs.

    ``conv5×5-64 (valid) → ReLU → maxpool 2`` (32 → 28 → 14), ``conv5×5-64 (valid) → ReLU → maxpool 2``
    (14 → 10 → 5), ``flatten (64·5·5 = 1600) → FC 384 → ReLU → FC 192 → ReLU → FC num_classes``; 797 962
    parameters for 10 classes and 3 input channels.  The model does not normalise its inputs.
    """
    _check_image_args(num_classes, in_channels)
    return FlatModel(partial(_build_acar_cnn, num_classes, in_channels))


class _BasicBlock(nn.Module):
    """``relu(norm(conv(relu(norm(conv(x))))) + shortcut(x))`` with 3×3 convolutions and GroupNorm.

    The shortcut is the identity when the shape is unchanged, otherwise a strided 1×1 convolution followed by
    GroupNorm (He et al.'s projection shortcut, option B).
    """

    def __init__(self, in_planes: int, planes: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, planes)
        if stride != 1 or in_planes != planes:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.GroupNorm(groups, planes)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _ResNetCifar(nn.Module):
    """CIFAR ResNet (He et al. 2016, Sec. 4.2): stem conv3×3-16, three stages of ``blocks`` basic blocks of widths
    16/32/64 (stride 2 at the first block of stages 2 and 3), global average pooling, FC."""

    def __init__(self, blocks: int, num_classes: int, in_channels: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, 16)
        layers: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            stage = []
            for b in range(blocks):
                stage.append(_BasicBlock(in_planes, planes, stride if b == 0 else 1, groups))
                in_planes = planes
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3 = layers
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = out.mean(dim=(-2, -1))  # global average pooling
        return self.fc(out)


def _build_resnet(blocks: int, num_classes: int, in_channels: int, groups: int) -> nn.Module:
    return _ResNetCifar(blocks, num_classes, in_channels, groups)


def resnet20(num_classes: int = 100, in_channels: int = 3, groups: int = 2) -> FlatModel:
    """ResNet-20 for ``(N, in_channels, 32, 32)`` inputs (He et al. 2016, CIFAR variant) with GroupNorm.

    Stem ``conv3×3-16 → GN → ReLU``; three stages of 3 basic blocks of widths 16/32/64, the first block of stages 2
    and 3 with stride 2 (32 → 16 → 8) and a ``1×1 conv + GN`` projection shortcut; global average pooling; FC
    ``64 → num_classes``.  Convolutions have no bias (a normalisation follows each one) and He (fan-out) initial
    weights; GroupNorm starts at weight 1, bias 0.  BatchNorm is replaced by ``GroupNorm(groups, C)``: BatchNorm's
    running statistics are buffers, which a ``FlatModel`` does not support and which federated averaging of
    parameters would not handle; ``groups`` must divide every width (16, 32, 64), i.e. divide 16.
    272 474 parameters for 10 classes (278 324 for the default 100) with 3 input channels.
    The model does not normalise its inputs.
    """
    _check_image_args(num_classes, in_channels)
    if groups < 1 or 16 % groups != 0:
        raise ValueError(f"groups must divide every width 16, 32 and 64 (i.e. divide 16), got {groups}")
    return FlatModel(partial(_build_resnet, 3, num_classes, in_channels, groups))


MODELS: dict[str, Callable[..., FlatModel]] = {
    "mlp": mlp,
    "logistic": logistic,
    "small-mlp": small_mlp,
    "zenke-cnn": zenke_cnn,
    "acar-cnn": acar_cnn,
    "resnet20": resnet20,
}


def make_model(name: str, **kw) -> FlatModel:
    """Model by name; ``kw`` go to its factory."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}") from None
    return factory(**kw)
