"""LeNet-style CNN: the FedAvg paper's MNIST CNN, for 1- or 3-channel images of any size >= 8."""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from . import MODELS, image_input, num_outputs, scaled

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
