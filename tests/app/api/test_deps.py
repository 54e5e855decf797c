"""Route dependencies read what the lifespan put on ``app.state``, per app."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.deps import BEARER_SCHEME, BearerDoc, SettingsDep, StoreDep, TelemetryDep
from app.core.settings import Settings
from app.core.telemetry import Telemetry


def _app(settings: Settings, store: object) -> FastAPI:
    app = FastAPI()
    app.state.settings = settings
    app.state.store = store
    app.state.telemetry = Telemetry()

    @app.get("/which")
    async def which(settings: SettingsDep, store: StoreDep, telemetry: TelemetryDep) -> dict:
        return {
            "port": settings.port,
            "store": store,
            "telemetry": telemetry is app.state.telemetry,
        }

    @app.post("/write", dependencies=[BearerDoc])
    async def write() -> None:
        return None

    return app


def test_each_app_hands_its_own_state_to_its_routes():
    first, second = _app(Settings(port=8001), "one"), _app(Settings(port=8002), "two")
    with TestClient(first) as a, TestClient(second) as b:
        assert a.get("/which").json() == {"port": 8001, "store": "one", "telemetry": True}
        assert b.get("/which").json() == {"port": 8002, "store": "two", "telemetry": True}


def test_the_bearer_dependency_only_documents_the_scheme():
    app = _app(Settings(), "s")
    with TestClient(app) as client:
        assert client.post("/write").status_code == 200  # enforced elsewhere, not here
        doc = client.get("/openapi.json").json()
    assert doc["paths"]["/write"]["post"]["security"] == [{BEARER_SCHEME: []}]
    assert doc["components"]["securitySchemes"][BEARER_SCHEME]["scheme"] == "bearer"
