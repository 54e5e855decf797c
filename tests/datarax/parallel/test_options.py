"""The pipeline's schedule, the context strategy and ZeRO-1 as plans take them: the
bubble is MaxText's formula, and what does not divide is refused with what would."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.parallel.options import (
    ContextParallel,
    ParallelOptions,
    Pipeline,
    check_context_split,
    pipeline_shape,
)


def test_bubble_is_base_yml_formula():
    # (stages - 1) / (repeats * microbatches + stages - 1)
    shape = pipeline_shape(Pipeline(microbatches=8), stages=4, layers=32, local_batch=16)
    assert (shape.repeats, shape.layers_per_stage, shape.microbatches) == (1, 8, 8)
    assert shape.bubble_fraction == pytest.approx(3 / 11)
    circular = pipeline_shape(
        Pipeline(microbatches=8, layers_per_stage=2, schedule="circular"),
        stages=4, layers=32, local_batch=16,
    )  # fmt: skip
    assert circular.repeats == 4
    assert circular.bubble_fraction == pytest.approx(3 / (4 * 8 + 3))
    # the default: as many microbatches as stages
    assert pipeline_shape(Pipeline(), stages=4, layers=32, local_batch=8).microbatches == 4


def test_schedules_keep_their_microbatches_in_flight():
    def in_flight(schedule: str, repeats_layers: int | None = None) -> float:
        pipe = Pipeline(microbatches=16, schedule=schedule, layers_per_stage=repeats_layers)
        return pipeline_shape(pipe, stages=4, layers=32, local_batch=16).in_flight

    # gpipe and circular: every iteration of the loop, the bubble's (stages - 1) too
    assert in_flight("gpipe") == pytest.approx((16 + 3) / 16)
    assert in_flight("circular", 2) == pytest.approx((4 * 16 + 3) / 64)
    assert in_flight("1f1b") == pytest.approx(4 / 16)
    # Megatron's interleaved schedule holds (1 + (p - 1) / (p v)) times 1F1B's
    assert in_flight("interleaved_1f1b", 2) == pytest.approx(4 / 16 * (1 + 3 / (4 * 4)))


@pytest.mark.parametrize(
    ("pipeline", "stages", "layers", "batch", "says"),
    [(Pipeline(), 8, 126, 8, "126 layers"),
     (Pipeline(layers_per_stage=3), 4, 32, 8, "layers_per_stage 3"),
     (Pipeline(microbatches=3), 4, 32, 8, "microbatches 3"),
     (Pipeline(microbatches=6, layers_per_stage=2, schedule="circular"), 4, 32, 12,
      "multiple of them")],
    ids=["stages", "layers-per-stage", "microbatches", "circular"],
)  # fmt: skip
def test_what_does_not_divide_is_refused(pipeline, stages, layers, batch, says):
    with pytest.raises(PlanError) as caught:
        pipeline_shape(pipeline, stages=stages, layers=layers, local_batch=batch)
    assert caught.value.code == "invalid_parallelism" and says in caught.value.message


def test_context_split_needs_two_chunks_a_shard_when_load_balanced():
    check_context_split(8192, 4, ContextParallel())
    check_context_split(12, 4, ContextParallel(load_balance=False))
    with pytest.raises(PlanError, match="load-balanced"):
        check_context_split(12, 4, ContextParallel())
    with pytest.raises(PlanError, match="seq_len 10"):
        check_context_split(10, 4, ContextParallel(load_balance=False))


def test_options_from_json_refuse_unknown_schedules():
    options = ParallelOptions.from_json({"schedule": "1f1b", "microbatches": None}, None, True)
    assert options.pipeline == Pipeline(schedule="1f1b") and options.shard_over_data
    with pytest.raises(PlanError, match="zero_bubble"):
        ParallelOptions.from_json({"schedule": "zero_bubble"})
    with pytest.raises(PlanError, match="ulysses"):
        ParallelOptions.from_json(None, {"strategy": "ulysses"})


def test_what_the_program_does_not_build_is_refused_in_one_place():
    from datarax.errors import PlanError
    from datarax.parallel.options import check_program_builds

    built = {"stages": 4, "context": 2, "schedule": "circular", "strategy": None}
    check_program_builds(**built)
    check_program_builds(**{**built, "stages": 1, "schedule": "1f1b"})
    check_program_builds(**{**built, "strategy": "ring"})  # both context strategies built
    refusals = [({"schedule": "1f1b"}, "'1f1b' schedule"),
                ({"schedule": "interleaved_1f1b"}, "'interleaved_1f1b' schedule"),
                ({"strategy": "ulysses"}, "'ulysses'")]  # fmt: skip
    for change, words in refusals:
        with pytest.raises(PlanError) as refused:
            check_program_builds(**{**built, **change})
        assert refused.value.code == "invalid_parallelism" and words in str(refused.value)
