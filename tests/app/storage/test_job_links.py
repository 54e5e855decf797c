"""The job_links table (app.storage.job_links): a link per job, replaced by a later one,
gone with its job; the measured steps read back newest first, bounded, non-numbers left
out; an older file gains the table on open."""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from app.storage import job_links
from app.storage import jobs as store_jobs
from app.storage.db import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "links.sqlite")
    s.open()
    yield s
    s.close()


def _point(step: int, reduced: str) -> store_jobs.PushItem:
    return store_jobs.PushItem(
        step=step, source="", sources=1, digest=reduced, num_devices=1, reduced=reduced
    )


def test_a_link_is_kept_replaced_and_deleted_with_its_job(store):
    items = [_point(0, '{"t":5.0}'), _point(1, '{"t":1.0}'), _point(2, '{"t":null}'),
             _point(3, '{"u":2.0}'), _point(4, '{"t":3.0}')]  # fmt: skip
    anyio.run(store_jobs.store_points, store, "j", items)
    link = job_links.JobLink("j", "plan-1", "t", "2026-12-06T00:00:00Z")
    assert anyio.run(job_links.link_job, store, link) is True
    assert anyio.run(job_links.link_job, store, job_links.JobLink("none", "p", "t", "x")) is False
    assert anyio.run(job_links.read_link, store, "j") == link
    later = job_links.JobLink("j", "plan-2", "t", "2026-12-06T00:01:00Z")
    anyio.run(job_links.link_job, store, later)
    assert anyio.run(job_links.read_links, store, ["j", "none"]) == {"j": later}
    # newest first; the null (a NaN stored) and the point without t are left out
    assert anyio.run(job_links.measured_steps, store, "j", "t") == [3.0, 1.0, 5.0]
    assert anyio.run(job_links.measured_steps, store, "j", "t", 2) == [3.0]
    assert anyio.run(store_jobs.remove_job, store, "j") is True
    assert anyio.run(job_links.read_link, store, "j") is None


def test_an_older_file_gains_the_table_when_opened(tmp_path):
    path = tmp_path / "old.sqlite"
    first = Store(path)
    first.open()
    first.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE job_links")
    conn.commit()
    conn.close()
    again = Store(path)
    again.open()
    try:
        assert anyio.run(job_links.read_link, again, "j") is None
    finally:
        again.close()
