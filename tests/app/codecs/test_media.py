"""Which bodies are JSON: ``application/json`` and any ``+json`` structured suffix."""

from __future__ import annotations

import pytest

from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE, is_json_media


@pytest.mark.parametrize(
    ("media", "json"),
    [
        (JSON_MEDIA_TYPE, True),
        ("application/problem+json", True),
        ("application/vnd.api+json", True),
        (NPZ_MEDIA_TYPE, False),
        ("text/plain", False),
        ("application/jsonp", False),
        (None, False),
    ],
)
def test_json_and_structured_json_suffixes(media, json):
    assert is_json_media(media) is json
