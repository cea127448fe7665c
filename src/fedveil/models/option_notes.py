"""One line per model option, for ``fedveil config show MODEL`` and docs/config.md.

``COMMON`` holds the options several models share (their builders' docstrings say the
same); ``BY_MODEL`` what one model means by an option. A test fails when a registered
model has an option without a line here.
"""
from __future__ import annotations

COMMON: dict[str, str] = {
    "width": "scales every hidden layer's channels or units (int(width * c))",
    "bases": "M > 1: a Split-Mix ensemble of M base nets, each of width width / M",
    "norm": "normalisation layers: one of scalable.NORMS (batch_average: batch statistics, no buffers)",
    "rescale_init": "Split-Mix's init rescaling (spec A.6); default on with BatchNorm, off with group or none; turn off with tracked BN",
    "rescale_layer": "Split-Mix's Scaler layer (spec A.6); None: on with BN",
    "hidden": "sizes of the hidden layers",
    "embed_dim": "size of each character's embedding",
    "alpha_min": "smallest keep ratio a layer's units may take",
    "alpha_max": "largest keep ratio a layer's units may take",
    "z_dim": "size of the encoder's output z (the representation the discriminator sees)",
    "head_hidden": "hidden layer sizes of the label head on z",
    "disc_hidden": "hidden layer sizes of the group discriminator on z",
    "groups": "number of groups (domains or sensitive values) the discriminator predicts",
    "conditioning": "what the discriminator also sees: none, or the head's prediction (CDAN)",
}

BY_MODEL: dict[tuple[str, str], str] = {
    ("adds_char_lstm", "hidden"): "units of the LSTM layer",
    ("adds_char_lstm", "fc"): "units of the FC layer after the LSTM (not given by the paper)",
    ("adds_vgg", "channels"): "channels of the Conv3x3-BN-ReLU-MaxPool stages; [] gives an MLP supernet",
    ("adds_vgg", "hidden"): "sizes of the two hidden FC layers",
    ("adds_vgg", "importance"): "unit importance: slim (|BN gamma|, mean activations) or lrp (z+ relevance)",
    ("char_lstm", "hidden"): "units of each LSTM layer",
    ("char_lstm", "layers"): "number of stacked LSTM layers",
    ("fade_mlp", "hidden"): "hidden layer sizes of the encoder (in -> hidden -> z_dim)",
    ("fedfed_vae", "latent"): "size of the VAE's latent code",
    ("fedfed_vae", "width"): "channels of the encoder's first convolution (2x, 4x deeper in)",
    ("fedfed_vae", "rho"): "the per-record bound ||x_s|| <= rho ||x|| on the shared features",
    ("fedfed_vae", "sigma"): "std of the noise the classifier sees in training",
    ("linear", "zero_init"): "start from all-zero weights and bias (as the MR-MTL code)",
    ("mlp", "hidden"): "sizes of the hidden layers; [] gives a linear model",
    ("resnet", "depth"): "blocks per stage: 6 * depth + 2 layers (3: ResNet-20)",
    ("resnet", "norm"): "group (GroupNorm, DP-safe), batch (not with example-level DP) or none",
    ("resnet", "groups"): "GroupNorm groups; must divide every stage width",
}


def option_note(model: str, option: str) -> str:
    """The one-line meaning of ``model``'s ``option`` ('' when none is written)."""
    return BY_MODEL.get((model, option), COMMON.get(option, ""))
