"""Built-in models and losses: the MLP the service trains and the tests use, and the
transformer of :class:`~datarax.specs.model_specs.TransformerSpec` that compile
checks compile and users train.

- :mod:`datarax.models.mlp`: :class:`MLP`, its losses (:data:`LOSS_FNS`), the optimizers
  (:func:`make_optimizer`) and :func:`synthetic_batch`.
- :mod:`datarax.models.transformer`: :class:`Transformer` (NNX), :func:`transformer_loss`,
  :func:`synthetic_tokens`, and the pure :func:`transformer_loss_fn` compile checks lower.
- :mod:`datarax.models.attention`: the ``dot`` and ``flash`` attention kernels.
- :mod:`datarax.models.decode`: KV-cached inference of the transformer (``prefill``,
  ``decode_step``, ``generate``), what serving plans' compile checks compile.
"""

from datarax.models.attention import blockwise_attention, dot_attention, flash_attention
from datarax.models.mlp import (
    LOSS_FNS,
    MLP,
    OPTIMIZERS,
    cross_entropy_loss,
    make_optimizer,
    mse_loss,
    synthetic_batch,
)
from datarax.models.transformer import (
    ActivationLayout,
    Transformer,
    remat_policy,
    synthetic_tokens,
    transformer_forward,
    transformer_loss,
    transformer_loss_fn,
)

__all__ = [
    "LOSS_FNS",
    "MLP",
    "OPTIMIZERS",
    "ActivationLayout",
    "Transformer",
    "blockwise_attention",
    "cross_entropy_loss",
    "dot_attention",
    "flash_attention",
    "make_optimizer",
    "mse_loss",
    "remat_policy",
    "synthetic_batch",
    "synthetic_tokens",
    "transformer_forward",
    "transformer_loss",
    "transformer_loss_fn",
]
