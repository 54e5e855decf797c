"""The checked-in Kubernetes example of replicas sharing PostgreSQL
(``deploy/kubernetes/datarax-replicas.yaml``, docs/INSTALL.md): every document valid
against Kubernetes' own schemas (``kubernetes-validate``, strict, the version
tests/datarax/launch/test_k8s.py uses), and what would make it deploy a broken service
caught: the database URL and token from the Secret and never in plain text, only real
settings, probes on real routes of the app, one port from the container to the Service.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, cast

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from fastapi.routing import APIRoute

from app.core.settings import Settings
from app.main import create_app
from app.workers.runtime_client import RuntimeClient
from tests.datarax.launch.test_k8s import KUBERNETES_VERSION
from tests.helpers import StubRuntime, make_settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "deploy" / "kubernetes" / "datarax-replicas.yaml"
PLACEHOLDER = "CHANGE-ME"


def _documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc is not None]


def _one(kind: str) -> dict[str, Any]:
    found = [doc for doc in _documents() if doc["kind"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def _container() -> dict[str, Any]:
    containers = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def _env() -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in _container()["env"]}


def _get_paths(folder: Path) -> set[str]:
    """The GET routes of the app as ``create_app`` builds it: nothing starts (no lifespan,
    a stand-in runtime) and app.main imports no JAX (tests/test_import_graph.py)."""
    app = create_app(make_settings(folder), runtime=cast(RuntimeClient, StubRuntime()))
    return {r.path for r in app.routes if isinstance(r, APIRoute) and "GET" in (r.methods or ())}


def _named_port(name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    assert name in ports, (name, ports)
    return int(ports[name])


def test_every_document_is_valid_kubernetes() -> None:
    documents = _documents()
    assert sorted(doc["kind"] for doc in documents) == ["Deployment", "Secret", "Service"]
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_is_not_vacuous() -> None:
    deployment = copy.deepcopy(_one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    ("variable", "key"),
    [("DATARAX_DATABASE_URL", "database-url"), ("DATARAX_API_TOKEN", "api-token")],
)
def test_secrets_come_from_the_secret(variable: str, key: str) -> None:
    secret = _one("Secret")
    entry = _env()[variable]
    assert "value" not in entry, f"{variable} in plain text"
    assert entry["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": key}
    assert key in secret["stringData"]
    assert PLACEHOLDER in secret["stringData"][key], "the placeholder a reader must replace"


def test_the_database_url_is_one_the_service_takes() -> None:
    url = _one("Secret")["stringData"]["database-url"]
    assert url.startswith("postgresql://")
    stored = Settings(database_url=url).database_url
    assert stored is not None and stored.get_secret_value() == url
    # The URL never goes in a flag: a flag shows in `ps`.
    command = _container().get("command", []) + _container().get("args", [])
    assert not [arg for arg in command if arg.startswith("--database-url")], command
    assert "--api-token" not in " ".join(command)


def test_every_variable_is_a_setting() -> None:
    for name in _env():
        assert name.startswith("DATARAX_"), name
        assert name.removeprefix("DATARAX_").lower() in Settings.model_fields, name
    assert _env()["DATARAX_HOST"]["value"] == "0.0.0.0"


def test_probes_point_at_the_apps_health_routes(tmp_path: Path) -> None:
    container, paths = _container(), _get_paths(tmp_path)
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in paths, (probe, get["path"], sorted(paths))
        assert _named_port(get["port"]) == _named_port("http"), probe


def test_the_container_port_is_the_services_port() -> None:
    port = _named_port("http")
    assert int(_env()["DATARAX_PORT"]["value"]) == port
    assert Settings.model_fields["port"].default == port
    image_port = re.search(r"DATARAX_PORT=(\d+)", (ROOT / "Dockerfile").read_text())
    assert image_port is not None and int(image_port.group(1)) == port
    service = _one("Service")["spec"]
    assert service["type"] == "ClusterIP"
    assert service["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]


def test_the_service_reaches_the_replicas_with_affinity() -> None:
    deployment, service = _one("Deployment")["spec"], _one("Service")["spec"]
    assert deployment["replicas"] == 3
    labels = deployment["template"]["metadata"]["labels"]
    assert deployment["selector"]["matchLabels"].items() <= labels.items()
    assert service["selector"].items() <= labels.items()
    # A training session runs on the replica that created it (docs/INSTALL.md).
    assert service["sessionAffinity"] == "ClientIP"
