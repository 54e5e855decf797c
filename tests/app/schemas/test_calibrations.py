"""The calibration answers (datarax.answers.calibrations) describe what the library
answers: every published profile validates against the answer's schema and parses back
unchanged, and a missing member does not validate."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from datarax.answers.calibrations import (
    CalibrationConstants,
    CalibrationList,
    CalibrationProfile,
    PublishedFitError,
)
from datarax.estimate.calibrations import published_profiles


def test_every_published_profile_validates_as_the_answer_schema():
    items = [profile.to_json() for profile in published_profiles()]
    listed = TypeAdapter(CalibrationList).validate_python({"items": items, "total": len(items)})
    assert [entry.id for entry in listed.items] == [item["id"] for item in items]
    for item in items:
        entry = TypeAdapter(CalibrationProfile).validate_python(item)
        assert isinstance(entry.constants, CalibrationConstants)
        assert entry.constants.matmul == item["constants"]["matmul"]
        parsed = CalibrationProfile.from_json(item)
        assert parsed.to_json() == item
        assert parsed.error is None or isinstance(parsed.error, PublishedFitError)
    broken = dict(items[0])
    del broken["constants"]
    with pytest.raises(ValidationError):
        TypeAdapter(CalibrationProfile).validate_python(broken)
    with pytest.raises(TypeError):
        CalibrationProfile.from_json(broken)
