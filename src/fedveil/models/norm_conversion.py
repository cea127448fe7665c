"""Make a module fit for per-example DP-SGD: BatchNorm layers, which normalise with the
statistics of the whole batch, replaced by GroupNorm, which normalises each example on its
own (Wu & He 2018, "Group Normalization"; Opacus' ModuleValidator.fix does the same)."""
from __future__ import annotations

from torch import nn

MAX_GROUPS = 32


def _groups(channels: int) -> int:
    """The largest divisor of ``channels`` up to MAX_GROUPS leaving at least 2 channels a
    group (GroupNorm needs a divisor; a group of one channel of a (N, C) input would
    normalise a single value)."""
    return max(g for g in range(1, max(1, min(MAX_GROUPS, channels // 2)) + 1) if channels % g == 0)


def batchnorm_to_groupnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm layer replaced in place by a GroupNorm over the same
    channels (affine when the BatchNorm was); returns ``model``. Trained statistics are not
    carried over: convert before training."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.GroupNorm(_groups(child.num_features), child.num_features, eps=child.eps, affine=child.affine))
        else:
            batchnorm_to_groupnorm(child)
    return model
