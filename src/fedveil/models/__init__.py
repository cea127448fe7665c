"""Model zoo: builders of ``nn.Module`` s that are pure functions of ``(params, x)``.

Every model is used functionally, with its state (parameters and buffers, see
:mod:`fedveil.models.functional`) passed in, and, where it can be, stacked over a
cohort. Buffers (BatchNorm running statistics: resnet ``norm="batch"``) are part of
that state, never kept in the shared module.

``build_model(name, input_shape, num_classes, **options)`` builds one;
``MODELS.entries()`` lists them. ``num_classes == 0`` means regression: one output,
shape ``(N, 1)``.
"""
from __future__ import annotations

from . import alexnet_bn, cnn, digit_cnn, fade, fedfed, linear, lstm, mlp, preresnet, resnet, supernet  # noqa: F401  (each registers its builders on MODELS)
from .complexity import count_macs, count_params
from .ensemble import BaseEnsemble
from .norm_conversion import batchnorm_to_groupnorm
from .scalable import Scaler, rescale_init_
from .zoo import MODELS, ModelBuilder, build_model, image_input, model_options, num_outputs, scaled

__all__ = [
    "MODELS", "BaseEnsemble", "ModelBuilder", "Scaler", "batchnorm_to_groupnorm", "build_model", "count_macs", "count_params",
    "image_input", "model_options", "num_outputs", "rescale_init_", "scaled",
]
