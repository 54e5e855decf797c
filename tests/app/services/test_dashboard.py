"""The dashboard's packaged assets (no HTTP): names, types, tags, gzip copies, versioned
references in the pages."""

from __future__ import annotations

import gzip
import hashlib
import re
from importlib import resources

from app.services.dashboard import (
    REDOC,
    SWAGGER_UI,
    UPLOT,
    asset_names,
    dashboard_page,
    docs_page,
    load_asset,
)


def test_assets_are_the_packaged_files():
    names = asset_names()
    assert "static/index.html" in names and "static/app.js" in names
    for vendor in (SWAGGER_UI, REDOC, UPLOT):
        assert any(name.startswith(vendor + "/") for name in names), vendor
    assert all(name.startswith(("static/", "vendor/")) for name in names)
    assert load_asset("static/../pyproject.toml") is None
    assert load_asset("static/nope.js") is None


def test_an_asset_has_its_type_a_content_tag_and_gzip_when_it_pays():
    script = load_asset("static/app.js")
    assert script is not None
    assert script.media_type == "text/javascript; charset=utf-8"
    assert script.tag == hashlib.blake2b(script.body, digest_size=16).hexdigest()
    assert script.gzipped is not None and gzip.decompress(script.gzipped) == script.body
    assert len(script.gzipped) < len(script.body)
    assert load_asset("static/app.js") is script  # read and compressed once


def test_pages_reference_their_assets_by_version():
    raw = resources.files("app.dashboard").joinpath("static/index.html").read_text()
    page = dashboard_page().body.decode()
    assert "{{v:" not in page
    for name in re.findall(r"\{\{v:([^}]+)\}\}", raw):
        asset = load_asset(name)
        assert asset is not None and asset.tag[:16] in page, name


def test_the_docs_pages_are_packaged():
    for kind in ("swagger", "redoc"):
        page = docs_page(kind)
        assert page.media_type.startswith("text/html") and page.body
