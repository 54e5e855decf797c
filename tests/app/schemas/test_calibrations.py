"""The calibration answers' schemas (app.schemas.calibrations) describe what the library
answers: every published profile validates, and a missing member does not."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.calibrations import CalibrationList, CalibrationProfileEntry
from datarax.estimate.calibrations import published_profiles


def test_every_published_profile_validates_as_the_answer_schema():
    items = [profile.to_json() for profile in published_profiles()]
    listed = CalibrationList.model_validate({"items": items})
    assert [entry.id for entry in listed.items] == [item["id"] for item in items]
    for item in items:
        entry = CalibrationProfileEntry.model_validate(item)
        assert entry.constants.matmul == item["constants"]["matmul"]
    broken = dict(items[0])
    del broken["constants"]
    with pytest.raises(ValidationError):
        CalibrationProfileEntry.model_validate(broken)
