"""FastAPI dependencies: what the lifespan built, handed to routes as ``Annotated`` aliases.

Routes declare ``store: StoreDep`` and get the app's :class:`~app.store.Store`; the objects
live on ``app.state`` (set by the lifespan in :mod:`app.main`), never in module globals,
so several apps (tests) can coexist in one process.

The dependency functions are ``async def`` although they do not await: FastAPI runs a
plain ``def`` dependency in a worker thread, a hop that costs more than the lookup.
"""

from __future__ import annotations

import email.message
import functools
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.errors import UnsupportedMediaType
from app.runtime import RuntimeClient
from app.settings import Settings
from app.store import Store
from app.telemetry import Telemetry

JSON_MEDIA_TYPE = "application/json"
NPZ_MEDIA_TYPE = "application/x-npz"


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_runtime(request: Request) -> RuntimeClient:
    return request.app.state.runtime


async def get_telemetry(request: Request) -> Telemetry:
    return request.app.state.telemetry


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
RuntimeDep = Annotated[RuntimeClient, Depends(get_runtime)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]


def media_type(request: Request) -> str | None:
    """The request's media type, lower-case, without parameters; None when absent."""
    # Read from the raw ASGI headers: building request.headers costs more than this.
    for name, value in request.scope["headers"]:
        if name == b"content-type":
            return _parse_media_type(value.decode("latin-1")) if value else None
    return None


@functools.lru_cache(maxsize=256)
def _parse_media_type(value: str) -> str:
    # Clients send a handful of distinct Content-Type values; parsing one costs ~10 us.
    message = email.message.Message()
    message["content-type"] = value
    return message.get_content_type().lower()


def accepts_npz(request: Request) -> bool:
    """True when the client prefers an ``application/x-npz`` answer to JSON.

    That is: its Accept header gives ``application/x-npz`` a q above 0 and above the q
    of an explicit ``application/json``. Wildcards (``*/*``, ``application/*``) and a
    missing header keep the JSON default, and a tie goes to JSON.
    """
    values = [value for name, value in request.scope["headers"] if name == b"accept"]
    if not values:
        return False
    # Repeated Accept headers are one comma-separated list (RFC 9110 section 5.3).
    return _prefers_npz(b",".join(values).decode("latin-1"))


@functools.lru_cache(maxsize=256)
def _prefers_npz(accept: str) -> bool:
    npz_q = json_q = 0.0
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(raw)
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media == NPZ_MEDIA_TYPE:
            npz_q = max(npz_q, q)
        elif media == JSON_MEDIA_TYPE:
            json_q = max(json_q, q)
    return npz_q > 0 and npz_q > json_q


def is_json_media(media: str | None) -> bool:
    return media is not None and (media == JSON_MEDIA_TYPE or media.endswith("+json"))


def require_json(request: Request) -> None:
    """415 ``unsupported_media_type`` unless the body is declared JSON.

    Runs before body validation, so a form or text body is a 415, not a 422.
    """
    media = media_type(request)
    if not is_json_media(media):
        raise UnsupportedMediaType(
            f"Content-Type {request.headers.get('content-type')!r} is not accepted here; "
            f"send {JSON_MEDIA_TYPE}"
        )


JsonBody = Depends(require_json)

BEARER_SCHEME = "bearerAuth"
"""OpenAPI name of the bearer scheme; ``{"security": [{BEARER_SCHEME: []}]}`` documents
it on a route that cannot afford the ``BearerDoc`` dependency."""

# Documentation only: the token is enforced by ``BearerAuthMiddleware`` in ``app.main``,
# before anything reads the body, so an unauthenticated request costs nothing. This
# dependency puts the bearer scheme on mutating operations in the OpenAPI document.
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name=BEARER_SCHEME,
    description="required on POST and DELETE when DATARAX_API_TOKEN is set",
)


async def _document_bearer(
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> None:
    return None


BearerDoc = Depends(_document_bearer)
