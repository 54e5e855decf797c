"""The plans table: round trips, page order, summaries and the byte budget of a page."""

from __future__ import annotations

import anyio
import pytest

from app.storage import plans
from app.storage.errors import Conflict


def test_plans_round_trip_and_order(store):
    async def main():
        for i in range(5):
            await plans.insert_plan(
                store, f"m_{i}", "2026-01-01T00:00:00Z", f"n{i}", i % 2 == 0, f'{{"i":{i}}}'
            )
        bodies, total = await plans.list_plans(store, 2, 1)
        assert total == 5 and bodies == ['{"i":3}', '{"i":2}']
        await plans.insert_plan(store, "m_s", "t", None, False, '{"big":1}', '{"small":1}')
        assert (await plans.list_plans(store, 1, 0, summary=True))[0] == ['{"small":1}']
        assert (await plans.list_plans(store, 1, 0))[0] == ['{"big":1}']
        assert await plans.get_plan(store, "m_4") == '{"i":4}'
        assert await plans.delete_plan(store, "m_4") is True
        assert await plans.delete_plan(store, "m_4") is False
        assert await plans.get_plan(store, "m_4") is None

    anyio.run(main)


def test_duplicate_plan_id_is_refused(store):
    plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")
    with pytest.raises(Conflict):
        plans.insert_plan_sync(store, "m_1", "t", None, False, "{}")


def test_a_plan_without_a_summary_is_its_own_summary(store):
    async def main():
        await plans.insert_plan(store, "m_1", "t", "n", True, '{"id":"m_1","shards":[]}')
        plans.insert_plan_sync(store, "m_2", "t", None, False, '{"id":"m_2"}', '{"s":2}')
        assert await plans.get_plan_summary(store, "m_1") == '{"id":"m_1","shards":[]}'
        assert await plans.get_plan_summary(store, "m_2") == '{"s":2}'
        assert await plans.get_plan(store, "m_2") == '{"id":"m_2"}'
        assert await plans.get_plan_summary(store, "m_missing") is None

    anyio.run(main)


def test_a_page_past_its_byte_budget_is_none_and_still_counts_every_plan(store):
    for i in range(4):
        plans.insert_plan_sync(store, f"m_{i}", "t", None, False, "x" * 10, "s")
    assert anyio.run(lambda: plans.list_plans(store, 3, 0, max_bytes=30)) == (["x" * 10] * 3, 4)
    assert anyio.run(lambda: plans.list_plans(store, 3, 0, max_bytes=29)) == (None, 4)
    # The budget counts the texts it reads: the summaries fit where the bodies do not.
    assert anyio.run(lambda: plans.list_plans(store, 4, 0, summary=True, max_bytes=4)) == (
        ["s"] * 4,
        4,
    )
    assert anyio.run(lambda: plans.list_plans(store, 10, 4)) == ([], 4)


def test_a_large_plan_is_stored_compressed_and_read_back_byte_for_byte(store, api):
    # issue 41: a 262,144-device abstract plan (27 MB answered) stores in under 5 MB
    answer = api.post("/v1/meshes", json={"axes": {"data": 512, "model": 512},
                                          "num_devices": 262144})  # fmt: skip
    assert answer.status_code == 201 and len(answer.content) > 20_000_000
    text = answer.content.decode()
    anyio.run(plans.insert_plan, store, "m_big", "2026-12-06T00:00:00Z", None, False, text,
              '{"id": "m_big"}')  # fmt: skip
    stored = anyio.run(plans.get_plan_stored, store, "m_big")  # as its column holds it
    assert isinstance(stored, bytes) and len(stored) < 5_000_000, (type(stored), len(stored))
    assert anyio.run(plans.get_plan, store, "m_big") == text
    texts, total = anyio.run(plans.list_plans, store, 1, 0)
    assert texts == [text] and total == 1
    # a small plan stays readable text
    anyio.run(plans.insert_plan, store, "m_small", "2026-12-06T00:00:01Z", None, False, "{}")
    assert anyio.run(plans.get_plan_stored, store, "m_small") == "{}"  # text, not bytes
