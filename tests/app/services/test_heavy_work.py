"""The heavy lane and the abandonable plan work, without HTTP (real threads, real anyio)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from app.core.errors import AnswerTooLarge, ServiceError
from app.schemas.hardware import HardwarePlanRequest, RecommendationRequest
from app.services import hardware
from app.services.heavy_work import HeavyWork
from app.services.plans import PlanRequest, abstract_devices, plan_size_floor, render_plan
from datarax.plan.layout import PlanCancelled

MODEL = {
    "kind": "transformer",
    "layers": 4,
    "d_model": 1024,
    "d_ff": 4096,
    "heads": 8,
    "kv_heads": 8,
    "vocab": 32000,
    "seq_len": 2048,
}


async def _until(condition) -> None:
    """Polls ``condition`` until it holds; fails after 10 seconds."""
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110 - a plain condition, no event to wait on
            await anyio.sleep(0.01)


def _spin(stop, seconds: float = 30.0) -> str:
    """Work that runs until told to stop (or ``seconds``), checking like the search does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop():
            raise PlanCancelled("stopped")
        time.sleep(0.005)
    return "finished"


def test_the_lane_runs_work_and_answers_its_result():
    lane = HeavyWork(2, 0, lambda: False)
    assert anyio.run(lambda: lane.run("t", lambda _stop: 42)) == 42
    assert lane.admitted == 0


def test_a_full_lane_answers_busy_with_retry_after():
    lane = HeavyWork(1, 1, lambda: False)
    release = threading.Event()
    codes: list[str] = []

    def hold(stop) -> str:
        while not release.is_set() and not stop():
            time.sleep(0.005)
        return "ok"

    async def main() -> list:
        async with anyio.create_task_group() as group:
            results: list = []

            async def one() -> None:
                results.append(await lane.run("t", hold))

            group.start_soon(one)
            group.start_soon(one)  # waits for the slot
            await _until(lambda: lane.admitted == 2)
            with pytest.raises(ServiceError) as caught:
                await lane.run("t", hold)
            codes.append(caught.value.code)
            assert caught.value.status == 503
            assert caught.value.headers["Retry-After"].isdigit()
            release.set()
        return results

    assert anyio.run(main) == ["ok", "ok"]
    assert codes == ["busy"]
    assert lane.admitted == 0


@pytest.mark.parametrize(
    ("gone_after", "shutting", "code"),
    [(0.2, False, "request_abandoned"), (None, True, "shutting_down")],
    ids=["client-gone", "sigterm"],
)
def test_abandoned_work_stops_and_frees_its_slot(gone_after, shutting, code):
    flag = {"shutting": False}
    lane = HeavyWork(1, 4, lambda: flag["shutting"])
    started = time.monotonic()

    async def client_gone() -> bool:
        return gone_after is not None and time.monotonic() - started > gone_after

    async def main() -> None:
        async with anyio.create_task_group() as group:
            if shutting:

                async def later() -> None:
                    await _until(lambda: lane.admitted == 1)  # the work is running
                    flag["shutting"] = True

                group.start_soon(later)
            with pytest.raises(ServiceError) as caught:
                await lane.run("search", _spin, client_gone)
            assert caught.value.code == code

    anyio.run(main)
    elapsed = time.monotonic() - started
    print(f"stopped after {elapsed:.2f} s of a 30 s job")
    assert elapsed < 25  # the work did not run its course
    assert lane.admitted == 0 and lane.abandoned == 1
    assert lane.limiter.borrowed_tokens == 0


def test_a_waiting_request_whose_client_left_never_starts():
    lane = HeavyWork(1, 4, lambda: False)
    ran: list[str] = []
    release = threading.Event()

    def hold(_stop) -> str:
        while not release.is_set():
            time.sleep(0.005)
        return "first"

    async def gone() -> bool:
        return True

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(lane.run, "t", hold)
            await _until(lambda: lane.limiter.borrowed_tokens == 1)
            with pytest.raises(ServiceError) as caught:
                await lane.run("t", lambda _stop: ran.append("second"), gone)
            assert caught.value.code == "request_abandoned"
            release.set()

    anyio.run(main)
    assert ran == []


def test_render_plan_stops_while_writing_shards():
    axes = {"data": 65536}
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(PlanCancelled):
        render_plan(
            PlanRequest(axes=axes, batch_shape=[65536]),
            axes,
            abstract_devices(axes),
            plan_id="m_x",
            created_at="t",
            should_stop=should_stop,
        )
    assert len(calls) == 3  # once before, then between blocks of shards


def test_a_plan_past_the_answer_limit_is_refused_before_it_is_written():
    name = "a" * 64
    axes = {name: 4096, "b" * 64: 16}
    devices = abstract_devices(axes)
    floor = plan_size_floor(axes, devices, 1)
    assert floor > 65536 * 2 * 64  # both names in every shard's coords
    with pytest.raises(AnswerTooLarge):
        render_plan(
            PlanRequest(axes=axes, batch_shape=[65536]),
            axes,
            devices,
            plan_id="m_x",
            created_at="t",
            max_bytes=floor - 1,
        )
    small = {"data": 64}
    text = render_plan(
        PlanRequest(axes=small, batch_shape=[64]),
        small,
        abstract_devices(small),
        plan_id="m_x",
        created_at="t",
        max_bytes=10**6,
    ).body
    assert len(text) >= plan_size_floor(small, abstract_devices(small), 1)


def test_hardware_plans_check_the_device_cap_before_laying_out():
    request = HardwarePlanRequest(
        hardware="tpu-v5e", topology="16x16", slices=4096, ici={"data": -1}, dcn={"data": -1}
    )
    started = time.perf_counter()
    with pytest.raises(ServiceError) as caught:
        hardware.render_hardware_plan(
            hardware.check_hardware_plan(request), plan_id="m_x", created_at="t"
        )
    print(f"refused in {(time.perf_counter() - started) * 1e3:.1f} ms")
    assert caught.value.code == "too_many_devices"
    assert caught.value.extra == {"devices": 1_048_576, "limit": 262_144}


def test_recommend_refuses_a_large_space_with_its_count_and_suggestions():
    request = RecommendationRequest(
        hardware="tpu-v5e",
        topology="4x4",
        slices=4096,
        model=MODEL,
        global_batch=64,
        axes=["data", "fsdp", "tensor", "batch", "replica", "model"],
    )
    with pytest.raises(ServiceError) as caught:
        hardware.recommend(request, max_search_space=20_000)
    extra = caught.value.extra
    assert caught.value.code == "search_space_too_large"
    assert extra["search_space"] == 126 * 6188 and extra["limit"] == 20_000
    assert {"change", "request", "search_space"} <= set(extra["suggestions"][0])
