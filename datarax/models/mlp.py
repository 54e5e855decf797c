"""The built-in MLP the service trains and the tests use, its losses and optimizers.

Parameters are named ``layers/{i}/kernel`` ``[f_i, f_{i+1}]`` and ``layers/{i}/bias``
``[f_{i+1}]``, float32; ReLU between layers, none after the last. Their shapes without
building a model: :func:`datarax.plan.memory.mlp_param_shapes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.typing import Dtype

OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd")


class MLP(nnx.Module):
    """A multi-layer perceptron: ``features = [in, hidden..., out]``."""

    def __init__(
        self, features: Sequence[int], *, rngs: nnx.Rngs, dtype: Dtype = jnp.float32
    ) -> None:
        features = [int(f) for f in features]
        if len(features) < 2 or any(f < 1 for f in features):
            raise ValueError(
                f"features must list at least 2 positive sizes [in, ..., out], got {features}"
            )
        self.features = tuple(features)
        self.layers = nnx.List(
            [
                nnx.Linear(a, b, rngs=rngs, dtype=dtype, param_dtype=dtype)
                for a, b in zip(features[:-1], features[1:], strict=True)
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x: [B, in]`` -> ``[B, out]``."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = jax.nn.relu(x)
        return x


def mse_loss(model: nnx.Module, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean squared error; ``targets: [B, out]`` float."""
    preds: jax.Array = model(batch["inputs"])
    return jnp.mean((preds - batch["targets"]) ** 2)


def cross_entropy_loss(model: nnx.Module, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Softmax cross-entropy; ``targets: [B]`` integer class ids."""
    logits: jax.Array = model(batch["inputs"])
    losses: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    return losses.mean()


LOSS_FNS = {"mse": mse_loss, "cross_entropy": cross_entropy_loss}


def make_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
    """``adam``, ``adamw`` or ``sgd`` at ``learning_rate``."""
    if name == "adam":
        return optax.adam(learning_rate)
    if name == "adamw":
        return optax.adamw(learning_rate)
    if name == "sgd":
        return optax.sgd(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}; use one of {list(OPTIMIZERS)}")


def synthetic_batch(
    features: Sequence[int], loss: str, batch_size: int, seed: int, step: int
) -> dict[str, np.ndarray]:
    """A deterministic batch that depends only on its arguments, never on devices.

    Returns:
      ``inputs: [batch_size, features[0]] float32`` and ``targets``: ``[batch_size,
      features[-1]] float32`` for ``mse``, ``[batch_size] int32`` class ids for
      ``cross_entropy``. Targets come from a fixed random linear map of the inputs, so
      the loss can go down.
    """
    rng = np.random.default_rng([int(seed), int(step), int(batch_size)])
    inputs = rng.standard_normal((batch_size, features[0]), dtype=np.float32)
    teacher = np.random.default_rng([int(seed), 7919]).standard_normal(
        (features[0], features[-1]), dtype=np.float32
    ) / np.sqrt(features[0])
    outputs = inputs @ teacher
    if loss == "cross_entropy":
        return {"inputs": inputs, "targets": np.argmax(outputs, axis=1).astype(np.int32)}
    return {"inputs": inputs, "targets": outputs.astype(np.float32)}
