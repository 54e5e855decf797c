"""Counting every HTTP answer into the service's own Prometheus metrics.

The series and their registry are :mod:`app.core.telemetry`'s; this is the ASGI layer that
feeds ``datarax_http_requests_total`` and ``datarax_http_request_duration_seconds``. It
sits outside the auth and body guards (:mod:`app.api.middleware`), so their 401s and 413s
are counted too.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.telemetry import UNMATCHED_ROUTE, Telemetry


class RequestMetricsMiddleware:
    """Pure ASGI middleware counting requests and latency per route template.

    The router stores the matched route in ``scope["route"]`` (the same dict this
    middleware passed on), so the template is read after the app has run.
    """

    def __init__(self, app: ASGIApp, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            self.telemetry.observe_request(
                scope.get("method", ""), template, status, time.perf_counter() - start
            )
