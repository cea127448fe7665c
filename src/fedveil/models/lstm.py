"""Next-character LSTM: the LEAF Shakespeare model."""
from __future__ import annotations

import torch
from torch import nn

from .zoo import MODELS


class CharLSTM(nn.Module):
    """Embedding -> stacked LSTM -> linear head on the last time step."""

    def __init__(self, vocab: int, embed_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-character logits from the LSTM's output at the window's last step."""
        out, _ = self.lstm(self.embed(x))
        return self.fc(out[:, -1])


@MODELS.register("char_lstm", "embedding(8) + 2-layer LSTM(256) next-character model (LEAF Shakespeare)")
def char_lstm(
    input_shape: tuple, num_classes: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2
) -> nn.Module:
    """Predicts the character after an int64 ``(N, seq_len)`` window; the vocabulary
    size is ``num_classes`` (LEAF Shakespeare: 80, seq_len 80).

    vmap: ``torch.func.vmap`` over *stacked parameters* (a cohort of clients) fails
    with "Batching rule not implemented for aten::lstm.input" (torch 2.13, CPU), so a
    cohort runner must loop over clients for this model. ``grad`` and per-example
    gradients (vmap over examples only, parameters shared) work, through torch's slow
    per-example fallback.
    """
    if len(input_shape) != 1:
        raise ValueError(f"char_lstm needs input_shape (seq_len,) of character ids, got {input_shape}")
    if num_classes < 1:
        raise ValueError("char_lstm classifies characters: num_classes must be the vocabulary size (> 0)")
    for option, value in (("embed_dim", embed_dim), ("hidden", hidden), ("layers", layers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{option} must be an int >= 1, got {value!r}")
    return CharLSTM(num_classes, embed_dim, hidden, layers)
