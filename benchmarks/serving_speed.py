"""Time the serving requests issue 57 bounds, over HTTP against an in-process service
(a temporary SQLite store, the real runtime).

Standalone (not part of ``make bench``)::

    .venv/bin/python -m benchmarks.serving_speed [--repeats 7]

Measured, each the median of ``--repeats`` requests:

- ``plan_405b_64_hosts``: ``POST /v1/meshes`` serving Llama 3.1 405B on 64 H100 hosts
  (512 GPUs: tensor 8 on each host, 32 replicas of 2 stages over InfiniBand), the plan
  stored and answered with its 512 shards (issue 57: under 100 ms);
- ``slo_recommendation_v5e_256``: ``POST /v1/recommendations`` with ``serving`` and
  ``slo`` over a TPU v5e-256 (Llama 2 70B, int8 weights): every tensor, stage and replica
  split laid out and priced (issue 57: under 1 s).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from app.schemas.serving import SERVING_RECOMMENDATION_EXAMPLE

PLAN_405B: dict[str, Any] = {
    "hardware": "h100-sxm",
    "hosts": 64,
    "ici": {"data": 1, "stage": 1, "tensor": 8},
    "dcn": {"data": 32, "stage": 2},
    "model": {"name": "llama3.1-405b"},
    "serving": {"input_tokens": 1000, "output_tokens": 1000, "concurrency": 256},
}
SLO_V5E_256: dict[str, Any] = SERVING_RECOMMENDATION_EXAMPLE
"""The documented recommendation example: Llama 2 70B int8 on a v5e-256 under an SLO."""


def _median_ms(client: TestClient, path: str, body: dict[str, Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        response = client.post(path, json=body)
        times.append(time.perf_counter() - start)
        response.raise_for_status()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(db=Path(tmp) / "datarax.sqlite", platforms="cpu", cpu_devices=8)
        with TestClient(create_app(settings)) as client:
            plan = _median_ms(client, "/v1/meshes", PLAN_405B, args.repeats)
            slo = _median_ms(client, "/v1/recommendations", SLO_V5E_256, args.repeats)
    print(f"plan_405b_64_hosts: {plan:.1f} ms (median of {args.repeats})")
    print(f"slo_recommendation_v5e_256: {slo:.1f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
