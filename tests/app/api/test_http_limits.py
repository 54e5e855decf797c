"""The HTTP limits in process: :class:`app.api.http_limits.AnswerLimitMiddleware` over every
method, status and body shape (declared length, streamed under and over the limit), and
:class:`app.api.http_limits.HeaderLimitMiddleware` on the app as ``create_app`` builds it.
The real server's protocol-level head limit is tested end to end in
``tests/e2e/test_http_limits.py``; the negotiation caches in ``test_http_cache.py`` and
``test_routing.py``.
"""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.api.http_limits import AnswerLimitMiddleware
from app.api.middleware import install_error_handlers
from app.core.answer_limit import ANSWER_LIMIT, check_answer_size
from app.main import create_app
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings

LIMIT = 1000


async def _sized(request):
    """An answer of ``?n=`` bytes (JSON text), with the status of ``?status=``."""
    n = int(request.query_params["n"])
    status = int(request.query_params.get("status", "200"))
    media = "application/problem+json" if status >= 400 else "application/json"
    return Response(b'"' + b"x" * (n - 2) + b'"', status_code=status, media_type=media)


async def _streamed(request):
    """``?parts=`` chunks of ``?size=`` bytes each, streamed (no Content-Length)."""
    parts, size = int(request.query_params["parts"]), int(request.query_params["size"])

    async def chunks():
        yield b"["
        for i in range(parts):
            yield (b"," if i else b"") + b'"' + b"y" * (size - 3) + b'"'
        yield b"]"

    return StreamingResponse(chunks(), media_type="application/json")


async def _checked(request):
    """Refuses itself through ``check_answer_size``, as a service does before storing."""
    check_answer_size(int(request.query_params["n"]), "the thing")
    return JSONResponse({"ok": True, "limit": ANSWER_LIMIT.get()})


def _answer_app() -> Starlette:
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    app = Starlette(
        routes=[
            Route("/sized", _sized, methods=methods),
            Route("/streamed", _streamed),
            Route("/checked", _checked),
            Route("/dashboard/big", _sized),
        ]
    )
    install_error_handlers(app)  # type: ignore[arg-type]
    app.add_middleware(AnswerLimitMiddleware, max_bytes=LIMIT)
    return app


@pytest.fixture(scope="module")
def answers():
    with TestClient(_answer_app()) as client:
        yield client


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("status", [200, 201, 404, 422])
def test_every_method_and_status_obeys_the_answer_limit(answers, method, status):
    under = answers.request(method, "/sized", params={"n": LIMIT, "status": status})
    assert (under.status_code, len(under.content)) == (status, LIMIT)
    over = answers.request(method, "/sized", params={"n": LIMIT + 1, "status": status})
    body = assert_problem(over, 422, "answer_too_large")
    assert f"{LIMIT + 1} bytes" in body["detail"] and "DATARAX_MAX_ANSWER_MB" in body["detail"]


@pytest.mark.parametrize(
    ("parts", "size", "refused"),
    [(1, 10, False), (9, 100, False), (11, 100, True), (1, 5000, True), (500, 50, True)],
    ids=["tiny", "just-under", "just-over", "one-big-chunk", "many-chunks"],
)
def test_streamed_answers_are_held_to_the_limit(answers, parts, size, refused):
    answer = answers.get("/streamed", params={"parts": parts, "size": size})
    if refused:
        assert_problem(answer, 422, "answer_too_large")
    else:
        assert answer.status_code == 200
        assert len(answer.json()) == parts


def test_services_see_the_limit_where_they_build_the_answer(answers):
    assert answers.get("/checked", params={"n": LIMIT}).json() == {"ok": True, "limit": LIMIT}
    body = assert_problem(answers.get("/checked", params={"n": LIMIT + 1}), 422, "answer_too_large")
    assert body["detail"].startswith("the thing")
    assert ANSWER_LIMIT.get() is None  # reset after the request
    check_answer_size(10**12)  # outside a request: no limit


def test_packaged_assets_are_not_answers(answers):
    assert answers.get("/dashboard/big", params={"n": LIMIT * 5}).status_code == 200


# --------------------------------------------------------------------- header limit


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("limits"), max_header_kb=8, max_headers=20)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as client:
        yield client


@pytest.mark.parametrize(
    "headers",
    [
        {"accept-encoding": "gzip," * 2000},
        {"accept": "a" * 9000},
        {"content-type": "application/json;" + "p=1;" * 3000},
        {"authorization": "Bearer " + "t" * 9000},
        {"cookie": "c=" + "1" * 9000},
        {"if-none-match": '"x",' * 3000},
        {f"x-{i}": "1" for i in range(30)},
    ],
    ids=["accept-encoding", "accept", "content-type", "authorization", "cookie", "inm", "many"],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_app_refuses_large_heads_itself(service, headers, method):
    answer = service.request(method, "/v1/meshes", headers=headers)
    body = assert_problem(answer, 431, "headers_too_large")
    assert "DATARAX_MAX_HEADER" in body["detail"]


@pytest.mark.parametrize("target", ["/health/live/" + "p" * 9000, "/health/live?q=" + "q" * 9000])
def test_a_long_path_or_query_counts_toward_the_head(service, target):
    assert_problem(service.get(target), 431, "headers_too_large")
    assert service.get(target[:100]).status_code != 431


def test_heads_under_the_limits_pass(service):
    answer = service.get("/v1/hardware", headers={"accept-encoding": "gzip, " + "x" * 6000})
    assert answer.status_code == 200
    assert answer.headers.get("content-encoding") == "gzip"
