"""What a plan says of its parallelism beyond the axis sizes: the pipeline's schedule, the
context-parallel strategy and ZeRO-1 (DESIGN v1.3), and their checks against a model.

MaxText's counterparts (``src/maxtext/configs/base.yml`` at commit
``e591f30cbbf217ed67ef71263ec0538239f9c3b8``): ``num_pipeline_microbatches`` (default:
the stages), ``num_layers_per_pipeline_stage`` (default 1 there; here ``layers /
stages``, one repeat, unless given), ``context_parallel_strategy`` (``all_gather`` by
default, or ``ring``), ``context_parallel_load_balance`` (default true) and
``shard_optimizer_over_data`` (default false). The bubble of a GPipe-like schedule is
base.yml's own formula, ``(stages - 1) / (repeats * microbatches + stages - 1)``.

Plain data, no NumPy and no JAX.

Example:
  >>> shape = pipeline_shape(Pipeline(microbatches=8), stages=4, layers=32, local_batch=16)
  >>> shape.repeats, round(shape.bubble_fraction, 3)
  (1, 0.273)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, cast

from datarax.answers.base import internal
from datarax.answers.estimates import PipelineEstimate, Schedule
from datarax.errors import PlanError

__all__ = [
    "BUILT_SCHEDULES",
    "check_program_builds",
    "CONTEXT_STRATEGIES",
    "SCHEDULES",
    "ContextParallel",
    "ParallelOptions",
    "Pipeline",
    "PipelineShape",
    "check_context_split",
    "check_stage_split",
    "pipeline_shape",
    "pipelined_layers",
]

SCHEDULES: tuple[str, ...] = ("gpipe", "circular", "1f1b", "interleaved_1f1b")
"""Pipeline schedules: ``gpipe`` (every microbatch forward, then every one backward),
``circular`` (MaxText's: GPipe over ``repeats`` passes round the stages), ``1f1b``
(PipeDream-flush: one forward, one backward once the pipeline is full) and
``interleaved_1f1b`` (Megatron's interleaved schedule over ``repeats`` model chunks)."""

CONTEXT_STRATEGIES: tuple[str, ...] = ("all_gather", "ring")
"""How attention reaches the keys and values of the other context shards: gathered
whole before attention, or passed round a ring one shard at a time, overlapping
attention on the shard at hand."""


BUILT_SCHEDULES = ("gpipe", "circular")
"""The pipeline schedules the library's program builds
(:mod:`datarax.models.pipeline`); plans price every one of :data:`SCHEDULES`."""


@dataclass(frozen=True)
class Pipeline:
    """A plan's ``pipeline`` object (DESIGN v1.3); ``None`` members take their defaults."""

    microbatches: int | None = None
    layers_per_stage: int | None = None
    schedule: str = "gpipe"


@dataclass(frozen=True)
class ContextParallel:
    """A plan's ``context_parallel`` object (DESIGN v1.3)."""

    strategy: str = "all_gather"
    load_balance: bool = True


@dataclass(frozen=True)
class ParallelOptions:
    """Everything :func:`~datarax.estimate.cost.estimate_step` needs besides the axes."""

    pipeline: Pipeline = Pipeline()
    context: ContextParallel = ContextParallel()
    shard_over_data: bool = False

    @classmethod
    def from_json(
        cls,
        pipeline: dict[str, Any] | None = None,
        context_parallel: dict[str, Any] | None = None,
        shard_over_data: bool = False,
    ) -> ParallelOptions:
        """From a plan request's ``pipeline`` and ``context_parallel`` objects and its
        optimizer's ``shard_over_data``.

        Raises:
          PlanError: ``invalid_parallelism`` for a schedule or strategy not listed.
        """
        pipe = Pipeline(**{k: v for k, v in (pipeline or {}).items() if v is not None})
        given = (context_parallel or {}).items()
        ctx = ContextParallel(**{k: v for k, v in given if v is not None})
        if pipe.schedule not in SCHEDULES:
            raise PlanError(
                "invalid_parallelism",
                f"pipeline.schedule {pipe.schedule!r} is not one of {list(SCHEDULES)}",
            )
        if ctx.strategy not in CONTEXT_STRATEGIES:
            raise PlanError(
                "invalid_parallelism",
                f"context_parallel.strategy {ctx.strategy!r} is not one of "
                f"{list(CONTEXT_STRATEGIES)}",
            )
        return cls(pipe, ctx, bool(shard_over_data))


@dataclass(frozen=True, eq=False)
class PipelineShape(PipelineEstimate):
    """A pipeline resolved against a model and a batch: a step estimate's ``pipeline``
    (:class:`~datarax.answers.estimates.PipelineEstimate`) and the share of microbatches
    in flight that the memory estimate reads.

    Attributes:
      stages: the stage axes' product.
      microbatches: microbatches a step runs through the pipeline.
      repeats: passes round the stages (``layers / (stages * layers_per_stage)``).
      layers_per_stage: layers a stage runs each time a microbatch passes it.
      schedule: one of :data:`SCHEDULES`.
      bubble_fraction: the share of the step the stages idle, ``(stages - 1) /
        (repeats * microbatches + stages - 1)``.
      in_flight: the share of a stage's microbatches whose activations it holds at
        its peak: under ``gpipe``/``circular`` all of them and the bubble's,
        ``(repeats * microbatches + stages - 1) / (repeats * microbatches)``: the
        schedule is a loop of that many iterations whose backward pass is its
        autodiff, which keeps every iteration's residuals, the idle ones' included
        (MaxText's pipeline and :mod:`datarax.models.pipeline`); ``min(microbatches,
        stages) / microbatches`` under ``1f1b``; that times ``1 + (stages - 1) /
        (stages * repeats)`` under ``interleaved_1f1b`` (Narayanan et al. 2021,
        https://arxiv.org/abs/2104.04473, section 2.2.2), at most 1. Internal: not in
        the answer.
    """

    in_flight: float = internal(1.0)


def pipeline_shape(
    pipeline: Pipeline, *, stages: int, layers: int, local_batch: int
) -> PipelineShape:
    """The pipeline of ``stages`` stages over a model of ``layers`` layers, with
    ``local_batch`` sequences per data shard.

    Raises:
      PlanError: ``invalid_parallelism`` when the stages (times ``layers_per_stage``)
        do not divide the layers, the microbatches do not divide the local batch, or a
        circular schedule's microbatches are not a multiple of the stages (MaxText's
        rule); the message says what would.
    """
    check_stage_split(layers, stages)
    per_stage = pipeline.layers_per_stage or layers // stages
    if per_stage < 1 or layers % (stages * per_stage):
        raise PlanError(
            "invalid_parallelism",
            f"pipeline.layers_per_stage {per_stage} times {stages} stages does not divide the "
            f"{layers} layers; use a divisor of {layers // stages}",
        )
    repeats = layers // (stages * per_stage)
    micro = pipeline.microbatches or stages
    if micro < 1 or local_batch % micro:
        raise PlanError(
            "invalid_parallelism",
            f"pipeline.microbatches {micro} does not divide the {local_batch} sequences of "
            "each data shard; use a divisor of it",
        )
    if pipeline.schedule in ("circular", "interleaved_1f1b") and repeats > 1 and micro % stages:
        raise PlanError(
            "invalid_parallelism",
            f"a {pipeline.schedule} schedule passes microbatches round the {stages} stages: "
            f"pipeline.microbatches ({micro}) must be a multiple of them",
        )
    bubble = (stages - 1) / (repeats * micro + stages - 1)
    in_flight = (repeats * micro + stages - 1) / (repeats * micro)
    if pipeline.schedule in ("1f1b", "interleaved_1f1b"):
        in_flight = min(micro, stages) / micro
        if pipeline.schedule == "interleaved_1f1b":
            in_flight = min(1.0, in_flight * (1 + (stages - 1) / (stages * repeats)))
    return PipelineShape(
        stages=stages,
        microbatches=micro,
        repeats=repeats,
        layers_per_stage=per_stage,
        schedule=cast(Schedule, pipeline.schedule),  # one of SCHEDULES (ParallelOptions)
        bubble_fraction=bubble,
        in_flight=in_flight,
    )


def pipelined_layers(model: Any) -> int:
    """The layers a transformer's pipeline stages split, as MaxText pipelines them: all
    of them, but the leading dense layers of a mixture-of-experts model
    (``first_dense_layers``, MaxText's ``first_num_dense_layers``: DeepSeek's 3 of 61) run
    before the pipeline on every stage, the stage axes splitting their batch as data does
    (MaxText's ``pipeline_parallel_layers`` default for its DeepSeek decoder: 58)."""
    leading = model.first_dense_layers if model.is_moe else 0
    return int(model.layers - leading)


def check_stage_split(layers: int, stages: int, leading: int = 0) -> None:
    """Refuse stages that do not divide the pipelined layers (each stage holds whole
    layers); ``leading``: the dense layers that run before the pipeline.

    Raises:
      PlanError: ``invalid_parallelism`` with the stage sizes that would.
    """
    if stages > 1 and layers % stages:
        fits = list(itertools.islice((n for n in range(2, layers + 1) if layers % n == 0), 8))
        what = (
            f"{layers} pipelined layers (its {leading} leading dense layers run before the "
            "pipeline, on every stage, as MaxText runs them)"
            if leading
            else f"{layers} layers"
        )
        raise PlanError(
            "invalid_parallelism",
            f"{stages} pipeline stages do not divide the model's {what}: each stage "
            f"holds whole layers; use a stage size among {fits[:8]}, or put the devices on "
            "fsdp or data",
        )


def check_context_split(seq_len: int, context: int, options: ContextParallel) -> None:
    """Refuse a context axis that does not divide the sequence (twice over with
    ``load_balance``, which cuts each shard in two chunks, as MaxText's reordering does).

    Raises:
      PlanError: ``invalid_parallelism``.
    """
    if context <= 1:
        return
    chunks = 2 * context if options.load_balance else context
    if seq_len % chunks:
        what = f"2 x {context} load-balanced chunks" if options.load_balance else f"{context}"
        raise PlanError(
            "invalid_parallelism",
            f"a context axis of {context} splits each sequence into {what}, which do not "
            f"divide seq_len {seq_len}: use a context size whose chunks divide it, or set "
            "context_parallel.load_balance to false",
        )


def check_program_builds(
    *, stages: int, context: int, schedule: str | None, strategy: str | None
) -> None:
    """Refuse what the library's training program does not build, though plans price it:
    a pipeline schedule beside :data:`BUILT_SCHEDULES` (``stages`` over 1). Both context
    strategies are built (``all_gather`` and ``ring``: :mod:`datarax.models.ring`), and
    the stages of dense and mixture-of-experts models. Compile checks run that program,
    so they say so rather than compile another step.

    Raises:
      PlanError: ``invalid_parallelism``.
    """
    schedule = schedule or "gpipe"
    if stages > 1 and schedule not in BUILT_SCHEDULES:
        raise PlanError(
            "invalid_parallelism",
            f"the library's program runs a transformer's layers as pipeline stages with "
            f"the {' and '.join(BUILT_SCHEDULES)} schedules (a loop of stages whose "
            f"backward pass is its autodiff); it does not build the {schedule!r} schedule, "
            "so XLA cannot be asked about this plan: its estimate prices it",
        )
    if context > 1 and (strategy or "all_gather") not in CONTEXT_STRATEGIES:
        raise PlanError(
            "invalid_parallelism",
            f"context_parallel.strategy {strategy!r} is not one of {list(CONTEXT_STRATEGIES)}",
        )
