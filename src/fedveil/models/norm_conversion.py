"""Make a module fit for per-example DP-SGD: BatchNorm layers, which normalise with the
statistics of the whole batch, replaced by GroupNorm, which normalises each example on its
own (Wu & He 2018, "Group Normalization"; Opacus' ModuleValidator.fix does the same)."""
from __future__ import annotations

from torch import nn

MAX_GROUPS = 32
MIN_GROUP = {1: 16, 2: 2}  # channels a group needs after a linear layer (1) and after a convolution (2)


def group_count(channels: int, dims: int = 2) -> int:
    """GroupNorm's groups for ``channels``: the most groups (up to MAX_GROUPS) that divide the
    channels and leave each group at least MIN_GROUP[dims] of them. After a convolution
    (``dims`` 2) a group spans every position of its channels, so 2 channels a group are
    plenty; after a linear layer (``dims`` 1) a group is only its features, and a group of 2
    normalises to +-1, keeping no more than a sign: there, 16 features a group (or one group)."""
    least = MIN_GROUP[dims]
    fitting = [g for g in range(1, MAX_GROUPS + 1) if channels % g == 0 and channels // g >= least]
    return max(fitting, default=1)


def batchnorm_to_groupnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm layer replaced in place by a GroupNorm over the same
    channels (affine when the BatchNorm was); returns ``model``. Trained statistics are not
    carried over: convert before training."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            dims = 1 if isinstance(child, nn.BatchNorm1d) else 2
            groups = group_count(child.num_features, dims)
            setattr(model, name, nn.GroupNorm(groups, child.num_features, eps=child.eps, affine=child.affine))
        else:
            batchnorm_to_groupnorm(child)
    return model
