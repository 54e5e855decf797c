"""datarax.client's Client and AsyncClient (datarax.client._clients): retries, Retry-After,
tokens, errors, defaults from JAX. The npz helpers and delays are in test_core.py, the
pushers in test_pusher.py.

Retries are exercised against a real HTTP server on a free port that answers from a
script (503/429 first, then 200); the service itself is driven by the client in
tests/e2e/test_jobs.py.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from datarax.answers.launch import MaxTextLaunch
from datarax.client import ApiError, AsyncClient, Client, jax_sources
from datarax.client._core import retry_delay
from datarax.client.answers import JobList, PushResult


class Scripted:
    """A real HTTP server answering each request with the next scripted answer."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen: list[tuple[str, str, dict]] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                script.seen.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = script.answers.pop(0)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer  # noqa: N815

            def log_message(self, *args):
                del args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _problem(status, code, **headers):
    body = json.dumps({"type": "x", "title": "t", "status": status, "detail": "d", "code": code})
    return status, {"content-type": "application/problem+json", **headers}, body.encode()


OK = (200, {"content-type": "application/json"}, b'{"items": [], "total": 0}')


def test_503_and_429_are_retried_honouring_retry_after():
    http_date = email.utils.formatdate(time.time() + 1, usegmt=True)
    answers = [
        _problem(503, "worker_lost", **{"retry-after": "0"}),
        _problem(429, "compile_queue_full", **{"retry-after": http_date}),
        OK,
    ]
    with Scripted(answers) as server, Client(server.url, backoff_s=0.01) as api:
        listed = api.list_jobs()
    assert isinstance(listed, JobList) and (listed.items, listed.total) == ([], 0)
    assert len(server.seen) == 3
    later = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 18 <= retry_delay(0, later, 5.0) <= 20
    assert retry_delay(3, None, 0.5) == 4.0 and retry_delay(0, "7", 0.1) == 7.0


def test_errors_carry_code_status_detail_after_the_retries_run_out():
    answers = [_problem(503, "worker_lost")] * 3
    with Scripted(answers) as server, Client(server.url, retries=2, backoff_s=0.001) as api:
        with pytest.raises(ApiError) as info:
            api.list_devices()
    assert (info.value.status, info.value.code, info.value.detail) == (503, "worker_lost", "d")
    assert len(server.seen) == 3
    with Scripted([_problem(409, "step_conflict")]) as server, Client(server.url) as api:
        with pytest.raises(ApiError) as info:
            api.push_job_metrics("j", 1, {"loss": np.ones(2)})
    assert info.value.code == "step_conflict" and len(server.seen) == 1  # 4xx: no retry


def test_token_from_argument_or_environment(monkeypatch):
    monkeypatch.setenv("DATARAX_API_TOKEN", "from-env")
    with Scripted([OK, OK]) as server:
        with Client(server.url) as api:
            api.list_jobs()
        with Client(server.url, token="given") as api:
            api.list_jobs()
    assert [seen[2].get("authorization") for seen in server.seen] == [
        "Bearer from-env",
        "Bearer given",
    ]


def test_async_client_retries_and_sends_arrays_and_sources(monkeypatch):
    fake_jax = types.SimpleNamespace(process_index=lambda: 3, process_count=lambda: 4)
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    assert jax_sources() == ("3", 4)
    pushed = {
        "job": "j",
        "step": 5,
        "source": "3",
        "sources": 4,
        "complete": False,
        "reduced": None,
        "received_at": "2026-12-01T08:00:00Z",
        "num_devices": 2,
        "missing_sources": ["0", "1", "2"],
        "warnings": ["loss: 1 NaN or infinite value(s), stored as null"],
    }
    answers = [
        _problem(503, "not_ready", **{"retry-after": "0"}),
        (201, {"content-type": "application/json"}, json.dumps(pushed).encode()),
    ]

    async def main():
        async with AsyncClient(server.url, backoff_s=0.001) as api:
            return await api.push_job_metrics("j", 5, {"loss": np.array([1.0, np.nan])})

    with Scripted(answers) as server:
        answer = asyncio.run(main())
    assert isinstance(answer, PushResult) and answer == pushed
    assert answer.missing_sources == ["0", "1", "2"] and answer["step"] == 5
    sent = json.loads(server.seen[-1][3])
    assert sent["step"] == 5 and sent["source"] == "3" and sent["sources"] == 4
    assert sent["metrics"]["loss"] == [1.0, None]  # the service reads null as NaN


def test_launch_sends_extra_args_and_env_as_the_contract_names_them():
    config = {"target": "maxtext", "args": ["run_name=a"], "env": {"WANDB_MODE": "offline"},
              "env_sources": {}, "command": ["python3"], "notes": [], "warnings": []}  # fmt: skip
    answer = (200, {"content-type": "application/json"}, json.dumps(config).encode())
    with Scripted([answer]) as server:
        got = Client(server.url, retries=0).launch(
            "p1", "maxtext", extra_args=("run_name=a",), extra_env={"WANDB_MODE": "offline"}
        )
    assert isinstance(got, MaxTextLaunch) and got.to_json() == config
    method, path, _, body = server.seen[0]
    assert (method, path) == ("POST", "/v1/meshes/p1/launch")
    assert json.loads(body) == {
        "target": "maxtext",
        "extra_args": ["run_name=a"],
        "extra_env": {"WANDB_MODE": "offline"},
    }
