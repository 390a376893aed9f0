"""Image-classification models used by the reproduced papers.

Every model is a :class:`FedModel`: ``features(x)`` gives the penultimate representation
``[B, feature_dim]`` and ``head`` (an ``nn.Linear``) maps it to logits. Models are written
for ``torch.func`` (``functional_call`` + ``vmap`` + ``grad`` over stacked parameters):
no in-place operations on activations, no data-dependent control flow, no dropout, and
every BatchNorm is :class:`fedlib.layers.MaskedBatchNorm` so padded batches stay exact.

Build one with :func:`build_model`; ``MODELS`` lists the names.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.layers import Conv2d, MaskedBatchNorm


class FedModel(nn.Module):
    """Base class: ``logits = head(features(x))``."""

    feature_dim: int
    head: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate representation, shape [B, feature_dim]."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, return_features: bool = False):
        """Logits [B, num_classes], or (logits, features) when ``return_features``."""
        features = self.features(x)
        logits = self.head(features)
        return (logits, features) if return_features else logits

    def head_parameter_names(self) -> list[str]:
        """Names (as in ``named_parameters``) of the classifier head's parameters."""
        return [f"head.{name}" for name, _ in self.head.named_parameters()]


class MLP(FedModel):
    """CELM's 4-layer MLP: flatten -> prod(input_shape)-256-128-64-C, ReLU; feature_dim 64.

    For Fashion-MNIST (1x28x28) the input layer is 784 wide.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 64)
        self.feature_dim = 64
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return F.relu(self.fc3(x))


class _TwoConvNet(FedModel):
    """Two conv + max-pool blocks, then FC-ReLU-FC-ReLU features (the CNNs and LeNet-5):
    ``flat`` inputs to FC ``hidden[0]``, FC ``hidden[0]``-``hidden[1]``, head; feature_dim ``hidden[1]``."""

    def __init__(self, conv1: nn.Conv2d, conv2: nn.Conv2d, flat: int, num_classes: int,
                 hidden: tuple[int, int] = (120, 84)):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2
        self.fc1 = nn.Linear(flat, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.feature_dim = hidden[1]
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.relu(self.fc2(x))


def _two_conv_cells(input_shape: tuple[int, int, int], name: str) -> int:
    """Spatial cells left after two unpadded 5x5 convolutions, each followed by a 2x2 max-pool."""
    _, height, width = input_shape
    flat_height, flat_width = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    if flat_height < 1 or flat_width < 1:
        raise ValueError(f"{name} needs inputs of at least 14x14, got {height}x{width}")
    return flat_height * flat_width


class CNN(_TwoConvNet):
    """5-weight-layer CNN for CIFAR-10; feature_dim 84.

    conv in->16 k5, ReLU, maxpool 2, conv 16->32 k5, ReLU, maxpool 2, flatten
    (32*5*5 = 800 for 32x32 input), FC 800-120, ReLU, FC 120-84, ReLU, head 84-C.
    Needs inputs of at least 14x14.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        channels, cells = input_shape[0], _two_conv_cells(input_shape, "cnn")
        super().__init__(Conv2d(channels, 16, kernel_size=5), Conv2d(16, 32, kernel_size=5), 32 * cells, num_classes)


class CNNWide(_TwoConvNet):
    """The 5-weight-layer CNN at wider widths, a reading of the papers' "5-layer CNN" (issue 30): the
    convolutions and first FC layer of McMahan et al. (2017)'s CIFAR-10 CNN (5x5 convs of 32 and 64
    channels, FC 512), and a second FC layer of 128 so it keeps five weight layers; feature_dim 128.

    conv in->32 k5, ReLU, maxpool 2, conv 32->64 k5, ReLU, maxpool 2, flatten (64*5*5 = 1600 for 32x32
    input), FC 1600-512, ReLU, FC 512-128, ReLU, head 128-C. Needs inputs of at least 14x14.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        channels, cells = input_shape[0], _two_conv_cells(input_shape, "cnn_wide")
        super().__init__(Conv2d(channels, 32, kernel_size=5), Conv2d(32, 64, kernel_size=5), 64 * cells, num_classes,
                         hidden=(512, 128))


class LeNet5(_TwoConvNet):
    """LeNet-5 with ReLU and max pooling, for 28x28 or 32x32 inputs; feature_dim 84.

    conv in->6 k5 (padding 2 on 28x28, none on 32x32), ReLU, maxpool 2,
    conv 6->16 k5, ReLU, maxpool 2, flatten 16*5*5 = 400, FC 400-120, ReLU,
    FC 120-84, ReLU, head 84-C.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        channels, height, width = input_shape
        if (height, width) not in ((28, 28), (32, 32)):
            raise ValueError(f"lenet5 needs 28x28 or 32x32 inputs, got {height}x{width}")
        super().__init__(Conv2d(channels, 6, kernel_size=5, padding=2 if height == 28 else 0),
                         Conv2d(6, 16, kernel_size=5), 16 * 5 * 5, num_classes)



class VGG11(FedModel):
    """CIFAR VGG-11 with BatchNorm, for 32x32 inputs; feature_dim 512.

    3x3 convs (padding 1, with bias) + BN + ReLU in the configuration
    64,M,128,M,256,256,M,512,512,M,512,512,M (M = maxpool 2), which leaves 512x1x1;
    flatten, head 512-C.
    """

    CONFIG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        channels, height, width = input_shape
        if (height, width) != (32, 32):
            raise ValueError(f"vgg11 needs 32x32 inputs, got {height}x{width}")
        layers: list[nn.Module] = []
        for entry in self.CONFIG:
            if entry == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                conv = Conv2d(channels, entry, 3, padding=1)
                layers += [conv, MaskedBatchNorm(entry), nn.ReLU()]
                channels = entry
        self.body = nn.Sequential(*layers)
        self.feature_dim = 512
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).flatten(1)


class ZeroPadShortcut(nn.Module):
    """Parameter-free shortcut (option A): strided subsampling, then zero channel padding."""

    def __init__(self, extra_channels: int, stride: int):
        super().__init__()
        self.extra_channels = extra_channels
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        before = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, before, self.extra_channels - before))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs (no bias) with BN, plus a shortcut.

    The shortcut is the identity when shapes match; otherwise ``"projection"``
    (1x1 conv, no bias, + BN; option B) or ``"zero_pad"`` (:class:`ZeroPadShortcut`; option A).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = MaskedBatchNorm(out_channels)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = MaskedBatchNorm(out_channels)
        if stride == 1 and in_channels == out_channels:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "projection":
            self.shortcut = nn.Sequential(
                Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                MaskedBatchNorm(out_channels),
            )
        else:
            self.shortcut = ZeroPadShortcut(out_channels - in_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(FedModel):
    """CIFAR-style ResNet: 3x3 stem conv (stride 1, no max-pool) + BN + ReLU, stages of
    :class:`BasicBlock` (the first block of every stage after the first has stride 2),
    global average pool, head ``widths[-1]``-C. Convs use Kaiming-normal init.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        widths: tuple[int, ...],
        blocks_per_stage: tuple[int, ...],
        shortcut: str,
    ):
        super().__init__()
        if shortcut not in ("projection", "zero_pad"):
            raise ValueError(f"shortcut must be 'projection' or 'zero_pad', got {shortcut!r}")
        self.stem = Conv2d(input_shape[0], widths[0], 3, padding=1, bias=False)
        self.stem_bn = MaskedBatchNorm(widths[0])
        blocks = []
        in_channels = widths[0]
        for stage, (width, num_blocks) in enumerate(zip(widths, blocks_per_stage)):
            for index in range(num_blocks):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(in_channels, width, stride, shortcut))
                in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.feature_dim = widths[-1]
        self.head = nn.Linear(self.feature_dim, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_bn(self.stem(x)))
        return self.blocks(x).mean(dim=(2, 3))


class ResNet20(CifarResNet):
    """ResNet-20 of He et al. (2016) for CIFAR: 3 stages x 3 BasicBlocks at 16/32/64
    channels, global average pool, head 64-C; feature_dim 64.

    ``shortcut="projection"`` (default; 1x1 conv + BN where the shape changes) gives
    272,474 parameters for 10 classes (278,324 for 100) on 3x32x32 inputs, the count
    the reproduced papers report. ``shortcut="zero_pad"`` is the paper's parameter-free
    option A (strided subsampling + zero channel padding): 269,722 parameters.
    """

    def __init__(
        self, input_shape: tuple[int, int, int], num_classes: int, shortcut: str = "projection"
    ):
        super().__init__(input_shape, num_classes, (16, 32, 64), (3, 3, 3), shortcut)


class ResNet18(CifarResNet):
    """CIFAR ResNet-18: 3x3 stem conv (stride 1, no max-pool), BasicBlocks [2,2,2,2] at
    64/128/256/512 channels with projection shortcuts (1x1 conv + BN), global average
    pool, head 512-C; feature_dim 512.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__(input_shape, num_classes, (64, 128, 256, 512), (2, 2, 2, 2), "projection")


_REGISTRY: dict[str, type[FedModel]] = {
    "mlp": MLP,
    "cnn": CNN,
    "lenet5": LeNet5,
    "cnn_wide": CNNWide,
    "resnet20": ResNet20,
    "vgg11": VGG11,
    "resnet18": ResNet18,
}
MODELS: tuple[str, ...] = tuple(_REGISTRY)


class ProjectionHead(FedModel):
    """``model`` with MOON's projection MLP between its features and a new classifier
    (github.com/QinbinLi/MOON ``model.py`` ``ModelFedCon``): h = features(x),
    z = l2(relu(l1(h))) (``out_dim`` wide), logits = head(z). ``features`` returns z, the
    representation the model-contrastive loss compares."""

    def __init__(self, model: FedModel, out_dim: int):
        super().__init__()
        num_classes = model.head.out_features
        model.head = nn.Identity()  # replaced by the classifier on z
        self.base, self.feature_dim = model, out_dim
        self.l1 = nn.Linear(model.feature_dim, model.feature_dim)
        self.l2 = nn.Linear(model.feature_dim, out_dim)
        self.head = nn.Linear(out_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(F.relu(self.l1(self.base.features(x))))


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, **kwargs
) -> FedModel:
    """Build model ``name`` (one of ``MODELS``) for inputs of shape (C, H, W).

    Extra keyword arguments go to the model's constructor (e.g. ``shortcut`` for resnet20).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    if len(input_shape) != 3 or not all(
        isinstance(size, numbers.Integral) and size > 0 for size in input_shape
    ):
        raise ValueError(f"input_shape must be three positive ints (C, H, W), got {input_shape!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return _REGISTRY[name](tuple(int(size) for size in input_shape), num_classes, **kwargs)
