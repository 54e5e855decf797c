"""FastAPI dependencies: what the lifespan built, handed to routes as ``Annotated`` aliases.

Routes declare ``store: StoreDep`` and get the app's :class:`~app.storage.db.Store`; the objects
live on ``app.state`` (set by the lifespan in :mod:`app.main`), never in module globals,
so several apps (tests) can coexist in one process.

The dependency functions are ``async def`` although they do not await: FastAPI runs a
plain ``def`` dependency in a worker thread, a hop that costs more than the lookup.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.routing import DOC_ONLY, require_json
from app.core.settings import Settings
from app.core.telemetry import Telemetry
from app.services.sessions import SessionService
from app.storage.store import Store
from app.workers.runtime_client import RuntimeClient


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_runtime(request: Request) -> RuntimeClient:
    return request.app.state.runtime


async def get_telemetry(request: Request) -> Telemetry:
    return request.app.state.telemetry


async def get_sessions(request: Request) -> SessionService:
    return request.app.state.sessions


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
RuntimeDep = Annotated[RuntimeClient, Depends(get_runtime)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]
SessionsDep = Annotated[SessionService, Depends(get_sessions)]


JsonBody = Depends(require_json)
"""415 before body validation: a form or text body is a 415, not a 422."""

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


setattr(_document_bearer, DOC_ONLY, True)  # a ParamsRoute leaves it out of the request
BearerDoc = Depends(_document_bearer)
