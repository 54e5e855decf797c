"""Record ids sort in creation order, even within one millisecond; times are RFC 3339 UTC."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from app.core.ids import new_plan_id, new_session_id, new_ulid, utc_now

CROCKFORD_ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def test_ulids_are_26_crockford_characters_and_sort_as_made():
    ids = [new_ulid() for _ in range(2000)]  # many fall in one millisecond
    assert all(CROCKFORD_ULID.match(i) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_ulid_starts_with_the_milliseconds_it_was_made_in():
    before = datetime.now(UTC).timestamp() * 1000
    value = new_ulid()
    after = datetime.now(UTC).timestamp() * 1000
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    ms = 0
    for char in value[:10]:  # 10 characters x 5 bits = the 48-bit timestamp (and 2 spare)
        ms = ms * 32 + alphabet.index(char)
    assert int(before) - 1 <= ms <= after + 1


def test_plan_and_session_ids_are_prefixed_ulids():
    plan, session = new_plan_id(), new_session_id()
    assert plan.startswith("m_") and CROCKFORD_ULID.match(plan[2:])
    assert session.startswith("s_") and CROCKFORD_ULID.match(session[2:])
    assert new_plan_id() > plan


def test_utc_now_is_rfc3339_with_z_to_the_second():
    text = utc_now()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text)
    parsed = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - parsed).total_seconds()) < 5
