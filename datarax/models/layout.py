"""Where a plan puts the transformer's activations: :class:`ActivationLayout`.

The layout pins each activation with ``with_sharding_constraint`` (or, for kernels XLA
cannot partition, gives ``shard_map`` its specs): the batch over the data, fsdp and
expert axes, the sequence over the context axes, tensor-split dimensions over the tensor
axes, and the tokens dispatched to experts over the expert axes.

Context parallelism follows MaxText's strategies (``context_parallel_strategy``,
``MaxText/layers/attention_op.py``). With ``all_gather``, every token-wise op
(projections, norms, the MLP and the experts, the loss) runs on the device's share of the
sequence, and attention gathers the keys and values over the context axes while each
device keeps its own queries. With ``load_balance`` (MaxText's
``context_parallel_load_balance``) the sequence is cut into ``2 x context`` chunks and
device ``i`` holds chunks ``i`` and ``2 x context - 1 - i``, so under a causal mask every
device attends to as many keys: the tokens enter the model in that order
(:meth:`ActivationLayout.balance`), each query keeps its true position for the mask
(:meth:`ActivationLayout.query_positions`), and the gathered keys and values are put back
in sequence order (:meth:`ActivationLayout.gathered`). With ``ring``, the keys and values
stay split and go round the context devices instead (:mod:`datarax.models.ring`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models.pipeline import StagePlan

__all__ = ["ActivationLayout", "balanced_order"]

Entry = str | tuple[str, ...] | None


def _entry(axes: tuple[str, ...]) -> Entry:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def balanced_order(seq_len: int, shards: int) -> np.ndarray:
    """Sequence positions in load-balanced order: ``2 x shards`` equal chunks, shard
    ``i`` holding chunks ``i`` and ``2 x shards - 1 - i`` (MaxText's
    ``reorder_sequence``). ``[0, ..., seq_len - 1]`` for one shard.

    Raises:
      ValueError: ``2 x shards`` does not divide ``seq_len``.
    """
    if shards <= 1:
        return np.arange(seq_len, dtype=np.int32)
    if seq_len % (2 * shards):
        raise ValueError(
            f"a load-balanced context split cuts the sequence into 2 x {shards} chunks, "
            f"which do not divide seq_len {seq_len}; set context_parallel.load_balance "
            "false or choose a sequence length they divide"
        )
    chunks = np.arange(seq_len, dtype=np.int32).reshape(2 * shards, -1)
    order = [c for i in range(shards) for c in (i, 2 * shards - 1 - i)]
    return chunks[order].reshape(-1)


class ActivationLayout:
    """Pins activations to a plan's layout: dimension 0 (the batch) over the batch axes,
    dimension 1 of token-wise activations (the sequence) over the context axes, and a
    tensor-split dimension (a ``col`` layer's output features, attention heads, the MLP
    hidden, the vocabulary, and the ``d``-wide residual stream, as MaxText's
    ``activation_embed`` rule and Megatron's sequence parallelism split it) over the
    tensor axes.

    Without these, XLA's sharding propagation is free to compile another program than the
    plan's: on an fsdp mesh it may keep the weights sharded and instead gather (or
    all-reduce) activations over the whole global batch, or leave attention replicated
    over the tensor axis. The flash kernel on TPU also reads ``mesh``, ``batch``,
    ``sequence`` and ``tensor`` to run per device under ``shard_map``.

    Args:
      mesh: the mesh.
      batch_axes: mesh axes the batch is split over (data, then fsdp).
      tensor_axes: mesh axes the tensor-parallel dimensions are split over.
      expert_axes: mesh axes the routed experts (and the tokens dispatched to them) are
        split over.
      fsdp_axes: mesh axes the experts' kernels are split over as fsdp splits them.
      sequence_axes: mesh axes the sequence is split over (context parallelism).
      load_balance: with sequence axes over 1, hold the sequence in load-balanced order
        (:func:`balanced_order`).
      pipeline: the decoder layers as pipeline stages over stage axes
        (:class:`~datarax.models.pipeline.StagePlan`).
      strategy: with sequence axes over 1, how attention reaches the other devices' keys
        and values: ``all_gather`` (:meth:`gathered`) or ``ring``
        (:func:`~datarax.models.ring.ring_attention`).

    Example:
      >>> layout = ActivationLayout(mesh, ("fsdp",), ("tensor",))  # doctest: +SKIP
      >>> x = layout(x, 2)  # [B, S, H, hd]: B over fsdp, H over tensor  # doctest: +SKIP
    """

    def __init__(
        self,
        mesh: Mesh,
        batch_axes: Sequence[str] = (),
        tensor_axes: Sequence[str] = (),
        expert_axes: Sequence[str] = (),
        fsdp_axes: Sequence[str] = (),
        sequence_axes: Sequence[str] = (),
        load_balance: bool = False,
        pipeline: StagePlan | None = None,
        strategy: str = "all_gather",
    ) -> None:
        sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
        named = (*batch_axes, *tensor_axes, *expert_axes, *sequence_axes)
        unknown = [a for a in named if a not in sizes]
        if unknown:
            raise ValueError(f"axes {unknown} are not axes of the mesh {list(mesh.axis_names)}")
        batch, tensor, expert = tuple(batch_axes), tuple(tensor_axes), tuple(expert_axes)
        self._given = (batch, tensor, expert, tuple(fsdp_axes), tuple(sequence_axes))
        if pipeline is not None and pipeline.stages > 1:
            # outside the stages (the embedding, the head and the loss) the batch is
            # split over the stage axes too, so the stages share that work
            batch = (*batch, *(a for a in pipeline.axes if a not in batch))
        self.mesh = mesh
        self.batch = _entry(batch)
        self._batch_shards = math.prod(sizes[a] for a in batch)
        self._stage_free_batch = _entry(self._given[0])
        self.tensor = _entry(tensor)
        self.expert = _entry(expert)
        self.sequence = _entry(tuple(sequence_axes))
        # the dispatched tokens' batch: the batch axes but the expert ones
        self.expert_batch = _entry(tuple(a for a in batch if a not in expert))
        self.t = math.prod(sizes[a] for a in tensor)
        self.e = math.prod(sizes[a] for a in expert)
        self.cp = math.prod(sizes[a] for a in sequence_axes)
        self.load_balance = bool(load_balance) and self.cp > 1
        if strategy not in ("all_gather", "ring"):
            raise ValueError(f"context strategy {strategy!r} is not 'all_gather' or 'ring'")
        self.strategy = strategy
        # the layers as pipeline stages over the stage axes (datarax.models.pipeline)
        self.pipeline = pipeline if pipeline is not None and pipeline.stages > 1 else None
        # the axes that split the experts' kernels as fsdp does (gathered a layer at a
        # time by the expert-parallel kernel)
        self.fsdp_axes = tuple(a for a in fsdp_axes if a in sizes and a not in expert)

    def within_stages(self) -> ActivationLayout:
        """The layout of the layers inside a pipeline's stages: the batch over the batch
        axes alone (the stage axes split the stages), no pipeline."""
        batch, tensor, expert, fsdp, sequence = self._given
        return ActivationLayout(
            self.mesh, batch, tensor, expert, fsdp, sequence, load_balance=self.load_balance,
            strategy=self.strategy,
        )  # fmt: skip

    def _pin(self, x: jax.Array, spec: list[Entry]) -> jax.Array:
        pinned: jax.Array = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*spec)))
        return pinned

    def _tensor(self, x: jax.Array, spec: list[Entry], dim: int | None) -> list[Entry]:
        if dim is not None and self.t > 1 and x.shape[dim] % self.t == 0:
            spec[dim] = self.tensor
        return spec

    def __call__(self, x: jax.Array, tensor_dim: int | None = None) -> jax.Array:
        """``x`` with dimension 0 on the batch axes, dimension 1 of a ``[B, S, ...]``
        activation on the context axes, and ``tensor_dim`` (where the tensor axes divide
        it) on the tensor axes; the other dimensions whole."""
        spec: list[Entry] = [None] * x.ndim
        # a batch the stage axes do not divide stays whole over them
        spec[0] = self.batch if x.shape[0] % self._batch_shards == 0 else self._stage_free_batch
        if self.cp > 1 and x.ndim >= 3 and tensor_dim != 1 and x.shape[1] % self.cp == 0:
            spec[1] = self.sequence
        return self._pin(x, self._tensor(x, spec, tensor_dim))

    def gathered(self, x: jax.Array, tensor_dim: int | None = None) -> jax.Array:
        """Keys or values ``[B, S, KV, hd]`` whole along the sequence (all-gathered over
        the context axes, then back in sequence order when load-balanced)."""
        spec: list[Entry] = [None] * x.ndim
        spec[0] = self.batch
        whole = self._pin(x, self._tensor(x, spec, tensor_dim))
        if not self.load_balance:
            return whole
        back = np.argsort(balanced_order(x.shape[1], self.cp)).astype(np.int32)
        return self._pin(whole.take(back, axis=1), self._tensor(x, list(spec), tensor_dim))

    def scores(self, x: jax.Array) -> jax.Array:
        """Attention scores ``[B, KV, G, S, T]``: batch, KV heads over the tensor axes,
        queries over the context axes."""
        spec: list[Entry] = [None] * x.ndim
        spec[0] = self.batch
        if self.cp > 1 and x.shape[3] % self.cp == 0:
            spec[3] = self.sequence
        return self._pin(x, self._tensor(x, spec, 1))

    def experts(self, x: jax.Array) -> jax.Array:
        """``x [experts, B, ...]`` (tokens dispatched to the experts) with its experts over
        the expert axes and its batch over the other batch axes: XLA moves each token to
        its expert's devices by all-to-all (MaxText's ``activation_exp`` rule)."""
        spec: list[Entry] = [None] * x.ndim
        if self.e > 1 and x.shape[0] % self.e == 0:
            spec[0] = self.expert
        spec[1] = self.expert_batch
        return self._pin(x, spec)

    def query_positions(self, seq_len: int) -> np.ndarray | None:
        """Each query's position in the sequence when the layout holds it load-balanced,
        ``None`` when it holds it in order."""
        return balanced_order(seq_len, self.cp) if self.load_balance else None

    def balance(self, x: jax.Array) -> jax.Array:
        """``[B, S, ...]`` tokens in the layout's order (load-balanced or as given)."""
        if not self.load_balance:
            return x
        return x.take(balanced_order(x.shape[1], self.cp), axis=1)

    def unbalance(self, x: jax.Array) -> jax.Array:
        """The inverse of :meth:`balance`: ``[B, S, ...]`` back in sequence order."""
        if not self.load_balance:
            return x
        return x.take(np.argsort(balanced_order(x.shape[1], self.cp)), axis=1)
