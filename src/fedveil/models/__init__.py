"""Model zoo: builders of ``nn.Module`` s that are pure functions of ``(params, x)``.

Every model is used through ``torch.func.functional_call(model, params, (x,))`` and,
where it can be, vmapped over a cohort's stacked parameters. So models keep no
buffers, update nothing in place in ``forward``, and use no BatchNorm.

``build_model(name, input_shape, num_classes, **options)`` builds one;
``MODELS.entries()`` lists them. ``num_classes == 0`` means regression: one output,
shape ``(N, 1)``.
"""
from __future__ import annotations

from . import cnn, linear, lstm, mlp, resnet  # noqa: F401  (each registers its builders on MODELS)
from .zoo import MODELS, ModelBuilder, build_model, image_input, model_options, num_outputs, scaled

__all__ = ["MODELS", "ModelBuilder", "build_model", "image_input", "model_options", "num_outputs", "scaled"]
