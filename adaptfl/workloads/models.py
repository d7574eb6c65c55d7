"""Model zoo for the image workloads, all trained from scratch."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

from torch import nn

from adaptfl.core.suggest import did_you_mean

# torchvision is imported by the builders that use it: importing it pulls in torch._dynamo
# (seconds), which every process that builds the cnn or the mlp would pay for nothing.


def build_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Build a freshly initialized model for square ``image_size`` inputs.

    Known names: "cnn", "vit-tiny", "mlp", "resnet18", "swin-lite". The weights depend only on the
    torch RNG state, so callers get identical models after ``torch.manual_seed``.
    """
    builder = MODEL_BUILDERS.get(name)
    if builder is None and name in LANGUAGE_MODELS:
        raise ValueError(f"{name!r} is a language model: pair it with a text task (fortunes, c4)")
    if builder is None:
        raise ValueError(f"unknown model {name!r}{did_you_mean(name, KNOWN_MODELS)}; known models: "
                         f"{', '.join(KNOWN_MODELS)}")
    for arg_name, value in (
        ("num_classes", num_classes),
        ("in_channels", in_channels),
        ("image_size", image_size),
    ):
        if value < 1:
            raise ValueError(f"{arg_name} must be >= 1, got {value!r}")
    return builder(num_classes, in_channels, image_size)


def build_cnn(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Two 5x5 conv blocks (32, 64 channels) and a 128-unit hidden layer.

    Unpadded 5x5 kernels shrink the feature map quickly, which keeps the
    model at ~0.18M (28 px) / ~0.26M (32 px) parameters and fast on CPU.
    """
    side = ((image_size - 4) // 2 - 4) // 2  # after conv5, pool2, conv5, pool2
    if side < 1:
        raise ValueError(f"cnn needs image_size >= 16, got {image_size!r}")
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * side * side, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


VIT_PATCH_SIZE = 4
VIT_HIDDEN_DIM = 192


def build_vit_tiny(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """ViT-Tiny (12 layers, 3 heads, width 192) on 4x4 patches, ~5.4M params."""
    return _vit(num_classes, in_channels, image_size, hidden=VIT_HIDDEN_DIM, heads=3, mlp=768)


def _vit(num_classes: int, in_channels: int, image_size: int, hidden: int, heads: int,
         mlp: int) -> nn.Module:
    if image_size % VIT_PATCH_SIZE != 0:
        raise ValueError(
            f"vit models need image_size divisible by {VIT_PATCH_SIZE}, got {image_size!r}"
        )
    from torchvision.models import VisionTransformer

    model = VisionTransformer(
        image_size=image_size,
        patch_size=VIT_PATCH_SIZE,
        num_layers=12,
        num_heads=heads,
        hidden_dim=hidden,
        mlp_dim=mlp,
        num_classes=num_classes,
    )
    # torchvision hard-codes 3 input channels; swap in a patch embedding for
    # ours, initialized the way torchvision initializes its own.
    patch_embedding = nn.Conv2d(in_channels, hidden, kernel_size=VIT_PATCH_SIZE, stride=VIT_PATCH_SIZE)
    fan_in = in_channels * VIT_PATCH_SIZE * VIT_PATCH_SIZE
    nn.init.trunc_normal_(patch_embedding.weight, std=math.sqrt(1 / fan_in))
    nn.init.zeros_(cast(nn.Parameter, patch_embedding.bias))  # bias=True (the default) creates it
    model.conv_proj = patch_embedding
    return cast(nn.Module, model)  # torchvision's models are untyped


def build_vit_s(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """ViT-S-like (12 layers, 6 heads, width 384, MLP 1536) on 4x4 patches, ~21.3M params: the
    size at which the GPU benchmarks compare the local update (benchmarks/)."""
    return _vit(num_classes, in_channels, image_size, hidden=384, heads=6, mlp=1536)


def build_mlp(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Flatten -> 64 hidden units -> classes; the cheapest model, for tests."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_channels * image_size * image_size, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def build_resnet18(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool,
    so 32 px inputs keep a 4x4 map before the pooling head (the ImageNet stem leaves 1x1). ~11.2M."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision
    model.maxpool = nn.Identity()
    return cast(nn.Module, model)


SWIN_EMBED_DIM = 48


def build_swin_lite(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """torchvision's SwinTransformer sized for 28-64 px: 2x2 patches, width 48, depths (2, 2, 2),
    4x4 windows (a 32 px image is 16x16 tokens, 4x4 after two merges). ~1.3M parameters."""
    if image_size < 8:
        raise ValueError(f"swin-lite needs image_size >= 8, got {image_size!r}")
    from torchvision.models import SwinTransformer

    model = SwinTransformer(patch_size=[2, 2], embed_dim=SWIN_EMBED_DIM, depths=[2, 2, 2],
                            num_heads=[3, 6, 12], window_size=[4, 4], num_classes=num_classes)
    # torchvision hard-codes 3 input channels in the patch embedding; swap in ours.
    model.features[0][0] = nn.Conv2d(in_channels, SWIN_EMBED_DIM, kernel_size=2, stride=2)
    return cast(nn.Module, model)


MODEL_BUILDERS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "cnn": build_cnn,
    "vit-tiny": build_vit_tiny,
    "vit-s": build_vit_s,
    "mlp": build_mlp,
    "resnet18": build_resnet18,
    "swin-lite": build_swin_lite,
}
KNOWN_MODELS = tuple(MODEL_BUILDERS)
# Language models: built from (vocab size, LlamaConfig) by workloads.tasks.build_task_model.
LANGUAGE_MODELS: dict[str, dict[str, int]] = {
    "llama-tiny": {"dim": 128, "num_layers": 2, "num_heads": 4, "hidden_dim": 352},  # ~0.46M
    "llama-small": {"dim": 256, "num_layers": 4, "num_heads": 8, "hidden_dim": 704},  # ~3.3M
}
