"""A text classifier for token-id sequences: the fastText-style bag of embeddings ("fasttext").

fastText (Joulin, Grave, Bojanowski and Mikolov, "Bag of Tricks for Efficient Text
Classification", EACL 2017, arXiv:1607.01759) averages the embeddings of a text's words and
classifies the average with a linear layer. PFLlib's ``fastText`` for AG News has the same
three layers as this one (an embedding with padding id 0, a hidden linear layer, the output
layer). Why this model and not a TextCNN: docs/algorithms.md, Datasets section.

The model takes what :func:`rayfed.data.transforms.model_inputs` gives for a token
dataset: int64 ids of shape (B, L), 0 = padding. Its input shape is (L, V); only V (the
vocabulary size) sizes a layer, so any sequence length fits. Top-level children are the blocks that
cwFedAvg's selective application counts (``embedding``, ``hidden``, ``fc``), and ``fc`` is
the output layer, as in the image models.
"""

from __future__ import annotations

import torch
from torch import nn

from rayfed.models._spec import InputShape, ModelSpec, ensure_supported, register_model

__all__ = ["FastText", "EMBEDDING_DIM", "PAD_ID"]

EMBEDDING_DIM = 32
"""D, the width of the embedding and the hidden layer."""
PAD_ID = 0
"""The padding token's id (:mod:`rayfed.data.text`): its embedding is zero and it is left out of the mean."""


def _fasttext_supports(input_shape: InputShape) -> str | None:
    if len(input_shape) != 2:
        return f"needs token sequences (L, V), got a shape of {len(input_shape)} dims"
    _, vocabulary = input_shape
    if vocabulary < 2:
        return f"needs a vocabulary of at least 2 tokens (padding and one more), got V={vocabulary}"
    return None


class FastText(nn.Module):
    """fastText-style classifier: mean of the tokens' embeddings, a linear layer, the output layer.

    ``embedding``: Embedding(V, D) with ``padding_idx=0``; the mean runs over the
    non-padding positions only (a text of n words is the average of n embeddings, however
    long the padding); ``hidden``: Linear(D->D), no activation (fastText is linear up to
    the softmax); ``fc``: Linear(D->K). D = :data:`EMBEDDING_DIM`.

    >>> model = FastText((200, 1000), 4)
    >>> model(torch.tensor([[5, 7, 0, 0]])).shape
    torch.Size([1, 4])
    """

    output_layer: str = "fc"

    def __init__(
        self, input_shape: InputShape, num_classes: int, embedding_dim: int = EMBEDDING_DIM, *, pool_all: bool = False
    ) -> None:
        super().__init__()
        ensure_supported("FastText", _fasttext_supports, input_shape)
        _, vocabulary = input_shape
        self.pool_all = pool_all
        """True: the mean over all L positions, padding (a zero embedding) included, as PFLlib's
        ``fastText.forward`` (``embedded_sent.mean(1)``); False: over the text's own tokens."""
        self.embedding = nn.Embedding(vocabulary, embedding_dim, padding_idx=PAD_ID)
        self.hidden = nn.Linear(embedding_dim, embedding_dim)
        self.fc = nn.Linear(embedding_dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) for token ids (B, L)."""
        mask = (ids != PAD_ID).unsqueeze(-1).to(self.hidden.weight.dtype)  # (B, L, 1)
        summed = (self.embedding(ids) * mask).sum(dim=1)
        count = torch.full_like(summed[:, :1], ids.shape[1]) if self.pool_all else mask.sum(dim=1).clamp(min=1.0)
        mean = summed / count  # an all-padding text averages to 0
        return self.fc(self.hidden(mean))


register_model(
    ModelSpec(
        name="fasttext",
        factory=FastText,
        supports=_fasttext_supports,
        description=f"fastText-style text classifier: mean embedding (D={EMBEDDING_DIM}) + linear + output",
        input_kind="tokens",
    )
)
register_model(
    ModelSpec(
        name="fasttext_pfllib",
        factory=lambda input_shape, num_classes: FastText(input_shape, num_classes, pool_all=True),
        supports=_fasttext_supports,
        description="fasttext as PFLlib's fastText: the mean runs over all L positions, padding included",
        input_kind="tokens",
    )
)
