"""The dashboard (``/``, ``/plans/{id}``, ``/jobs/{job}``, ``/sessions/{id}``, ``/devices``),
its assets, and the offline API docs (``/docs``, ``/redoc``): HTTP only.

:mod:`app.services.dashboard` reads the files. Pages are one HTML document that renders the
page its address names, so every address can be bookmarked and shared. Assets answer with a
strong ETag (304 to ``If-None-Match``), their gzip copy when the client accepts gzip, and a
year of caching (their addresses change when their content does); the HTML revalidates.
None of these routes is part of the API, so none is in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from app.api.http_cache import accepts_gzip, etag_matches
from app.core.errors import ServiceError
from app.services import dashboard
from app.services.dashboard import CONTENT_SECURITY_POLICY, Asset

router = APIRouter(include_in_schema=False)

PAGE_CACHE = "no-cache"
ASSET_CACHE = "public, max-age=31536000, immutable"


def _asset_response(request: Request, asset: Asset, cache_control: str) -> Response:
    headers = {
        "Cache-Control": cache_control,
        "X-Content-Type-Options": "nosniff",
    }
    if asset.media_type.startswith("text/html"):
        headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    if asset.gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
    use_gzip = asset.gzipped is not None and accepts_gzip(
        request.headers.get("accept-encoding", "").encode("latin-1")
    )
    headers["ETag"] = f'"{asset.tag}.gz"' if use_gzip else f'"{asset.tag}"'
    if etag_matches(request.headers.get("if-none-match", "").encode("latin-1"), asset.tag):
        return Response(status_code=304, headers=headers)
    if use_gzip:
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


async def _page(request: Request) -> Response:
    page = await anyio.to_thread.run_sync(dashboard.dashboard_page)
    return _asset_response(request, page, PAGE_CACHE)


@router.get("/")
async def home(request: Request) -> Response:
    """The dashboard: plans, jobs, sessions and devices."""
    return await _page(request)


@router.get("/plans/{mesh_id}")
async def plan_page(request: Request, mesh_id: Annotated[str, Path(max_length=64)]) -> Response:
    del mesh_id  # the page reads it from its address
    return await _page(request)


@router.get("/jobs/{job}")
async def job_page(request: Request, job: Annotated[str, Path(max_length=128)]) -> Response:
    del job
    return await _page(request)


@router.get("/sessions/{session_id}")
async def session_page(
    request: Request, session_id: Annotated[str, Path(max_length=64)]
) -> Response:
    del session_id
    return await _page(request)


@router.get("/devices")
async def devices_page(request: Request) -> Response:
    return await _page(request)


@router.get("/docs")
async def swagger_ui(request: Request) -> Response:
    """Swagger UI over ``/openapi.json``, every file served from the package."""
    page = await anyio.to_thread.run_sync(dashboard.docs_page, "swagger")
    return _asset_response(request, page, PAGE_CACHE)


@router.get("/redoc")
async def redoc(request: Request) -> Response:
    """ReDoc over ``/openapi.json``, every file served from the package."""
    page = await anyio.to_thread.run_sync(dashboard.docs_page, "redoc")
    return _asset_response(request, page, PAGE_CACHE)


@router.get("/dashboard/{name:path}")
async def dashboard_asset(request: Request, name: str) -> Response:
    """A file of ``app/dashboard/static`` or ``app/dashboard/vendor``; 404 ``not_found``
    for any other name."""
    asset = await anyio.to_thread.run_sync(dashboard.load_asset, name[:300])
    if asset is None:
        raise ServiceError(f"no dashboard asset named {name[:300]!r}", code="not_found")
    return _asset_response(request, asset, ASSET_CACHE)
