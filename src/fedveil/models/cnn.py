"""Small CNNs: the FedAvg paper's MNIST CNN (LeNet-style) and MR-MTL's ConvNet."""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .zoo import MODELS, image_input, num_outputs, scaled

MIN_SIZE = 8


@MODELS.register("lenet", "conv5x5(32)-pool-conv5x5(64)-pool-fc512 CNN (FedAvg's MNIST CNN)")
def lenet(input_shape: tuple, num_classes: int, width: float = 1.0) -> nn.Module:
    """Two 5x5 'same' convolutions, each followed by ReLU and 2x2 max-pooling, then
    fc512-ReLU-fc(num_classes or 1). ``width`` scales the 32/64 channels and 512 units.

    On 1x28x28 MNIST with 10 classes this is the FedAvg CNN (1,663,370 parameters);
    the 'same' padding lets it run on images down to 8x8 (e.g. sklearn digits).
    """
    to_image, (c, h, w) = image_input(input_shape, "lenet")
    if h < MIN_SIZE or w < MIN_SIZE:
        raise ValueError(f"lenet needs images of at least {MIN_SIZE}x{MIN_SIZE}, got {h}x{w}")
    c1, c2, fc = scaled(32, width), scaled(64, width), scaled(512, width)
    return nn.Sequential(
        OrderedDict(
            image=to_image,
            conv1=nn.Conv2d(c, c1, kernel_size=5, padding=2),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(c1, c2, kernel_size=5, padding=2),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(c2 * (h // 4) * (w // 4), fc),
            relu3=nn.ReLU(),
            fc2=nn.Linear(fc, num_outputs(num_classes)),
        )
    )


@MODELS.register("convnet", "conv3x3(32)-pool-conv3x3(64)-pool-linear CNN, unpadded (MR-MTL's ConvNet)")
def convnet(input_shape: tuple, num_classes: int, width: float = 1.0) -> nn.Module:
    """Two unpadded 3x3 convolutions, each followed by ReLU and 2x2 max-pooling, then one
    linear layer (Liu et al. 2022, App. B.1; spec 002 §5). ``width`` scales the 32/64 channels.

    On 1x28x28 with 10 classes: 28 -> 26 -> 13 -> 11 -> 5, 34,826 parameters (the spec's
    count for Rotated & Masked MNIST); on 3x32x32, 42,442 (Heterogeneous CIFAR-10).
    """
    to_image, (c, h, w) = image_input(input_shape, "convnet")
    out_h, out_w = ((h - 2) // 2 - 2) // 2, ((w - 2) // 2 - 2) // 2
    if out_h < 1 or out_w < 1:
        raise ValueError(f"convnet needs images of at least 10x10, got {h}x{w}")
    c1, c2 = scaled(32, width), scaled(64, width)
    return nn.Sequential(
        OrderedDict(
            image=to_image,
            conv1=nn.Conv2d(c, c1, kernel_size=3),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(c1, c2, kernel_size=3),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc=nn.Linear(c2 * out_h * out_w, num_outputs(num_classes)),
        )
    )
