"""The dashboard in a real browser: headless Chromium (Debian's package) driven by
Playwright, against the real ``datarax-serve`` with real data made through the API.

Runs when ``/usr/bin/chromium`` (or ``DATARAX_CHROMIUM``) and Playwright are there; skips
loudly when not, and fails when ``CI=true`` (.ci/run installs Chromium). Screenshots go to
each test's temp dir, for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.helpers import ServiceProcess

pytestmark = pytest.mark.timeout(300)

CHROMIUM = os.environ.get("DATARAX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "dashboard-test-token"
JOB_STEPS = 100_000
BATCH = 1000  # points per batch push: the contract's maximum
PAGE_READY_MS = 30_000


def _need(what: str) -> None:
    message = f"browser tests need {what}; install it (.ci/run does: apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " -- CI=true, so this is a failure, not a skip")
    warnings.warn(message, stacklevel=2)
    pytest.skip("LOUD SKIP: " + message)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the playwright Python package (pip install -e .[dev])")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _need(f"Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _api(service: ServiceProcess) -> httpx.Client:
    return httpx.Client(
        base_url=service.base_url, timeout=120.0, headers={"Authorization": f"Bearer {TOKEN}"}
    )


def _push_job(client: httpx.Client, job: str, steps: int) -> str:
    """``steps`` points of two metrics over 4 devices, a noisy falling loss with a spike,
    pushed 1,000 at a time through the batch endpoint."""
    batch_path = f"/v1/jobs/{job}/metrics/batch"
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/jobs/{job}/metrics/batch" in paths, "the batch push endpoint is missing"
    for start in range(0, steps, BATCH):
        points = []
        for step in range(start, min(steps, start + BATCH)):
            base = 2.0 / (1.0 + step / 5000.0) + (3.0 if step == 61_234 else 0.0)
            loss = [base + 0.01 * d + 0.05 * ((step * 7 + d) % 5) for d in range(4)]
            points.append(
                {"step": step, "metrics": {"loss": loss, "accuracy": [1.0 - base / 3.0] * 4}}
            )
        answer = client.post(batch_path, json={"points": points})
        assert answer.status_code in (200, 201), answer.text[:500]
    return job


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard-e2e")
    env = {"DATARAX_API_TOKEN": TOKEN}
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as server:
        server.wait_ready()
        with _api(server) as client:
            data = {}
            live = client.post(
                "/v1/meshes",
                json={"axes": {"data": 2, "model": 4}, "batch_shape": [64, 16], "name": "live-2x4"},
            )
            assert live.status_code == 201, live.text
            data["live"] = live.json()
            abstract = client.post(
                "/v1/meshes",
                json={"axes": {"data": -1, "model": 8}, "num_devices": 1024, "name": "abs-1024"},
            )
            assert abstract.status_code == 201, abstract.text
            data["abstract"] = abstract.json()
            pod = client.post(
                "/v1/meshes",
                json={
                    "name": "pod-65536",
                    "hardware": "tpu-v5e",
                    "topology": "16x16",
                    "slices": 256,
                    "ici": {"data": 1, "fsdp": -1, "tensor": 16},
                    "dcn": {"data": -1},
                    "batch_shape": [65536, 2048],
                    "batch_axes": ["data", "fsdp"],
                    "model": {
                        "kind": "transformer",
                        "layers": 4,
                        "d_model": 1024,
                        "d_ff": 4096,
                        "heads": 16,
                        "kv_heads": 16,
                        "vocab": 32000,
                        "seq_len": 2048,
                    },
                },
            )
            assert pod.status_code == 201, pod.text[:500]
            data["pod"] = {
                k: v for k, v in pod.json().items() if k not in ("shards", "device_grid")
            }
            session = client.post(
                f"/v1/meshes/{data['live']['id']}/sessions",
                json={"model": {"kind": "mlp", "features": [16, 32, 4]}},
            )
            assert session.status_code == 201, session.text
            data["session"] = session.json()
            ran = client.post(
                f"/v1/sessions/{data['session']['id']}/steps",
                json={"steps": 5, "synthetic": {"seed": 0, "batch_size": 64}},
            )
            assert ran.status_code == 200, ran.text
            data["job"] = _push_job(client, "train-100k", JOB_STEPS)
        server.data = data
        yield server


class Watch:
    """Every request a page makes, how it ended, and every console error it logs."""

    def __init__(self, page):
        self.urls: list[str] = []
        self.blocked: list[tuple[str, str]] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("requestfailed", lambda r: self.blocked.append((r.url, r.failure or "")))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def assert_local(self) -> None:
        """Every request went to 127.0.0.1, except ones the page's CSP refused before they
        reached the network; no URL holds the token."""
        refused = {url for url, failure in self.blocked if "csp" in failure.lower()}
        for url in self.urls:
            assert TOKEN not in url, f"the token is in a URL: {url}"
            parts = urlsplit(url)
            if parts.scheme in ("data", "blob") or url in refused:
                continue
            assert parts.hostname == "127.0.0.1", f"a request left 127.0.0.1: {url}"

    def assert_clean(self) -> None:
        self.assert_local()
        assert not self.errors, self.errors


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.watch = Watch(page)
    yield page
    context.close()


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=PAGE_READY_MS)
    assert page.get_attribute("body", "data-ready") == "true", page.inner_text("main")


def test_home_lists_plans_newest_first_and_searches(page, service, tmp_path):
    _open(page, service.base_url + "/")
    rows = page.locator("table.plans tbody tr")
    rows.first.wait_for()
    names = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    assert names == ["pod-65536", "abs-1024", "live-2x4"], names
    assert rows.nth(2).locator(".badge").inner_text() == "live"
    assert rows.nth(1).locator(".badge").inner_text() == "abstract"
    page.fill("#plan-search", "abs-1024")
    assert page.locator("table.plans tbody tr").count() == 1
    page.locator("table.jobs tbody tr").first.wait_for()
    assert "train-100k" in page.inner_text("table.jobs")
    page.screenshot(path=tmp_path / "home.png", full_page=True)
    page.watch.assert_clean()


def test_the_65536_device_plan_page(page, service, tmp_path):
    pod = service.data["pod"]
    started = time.perf_counter()
    _open(page, f"{service.base_url}/plans/{pod['id']}")
    page.wait_for_function(
        "() => { const i = document.querySelector('#layout'); return i && i.complete "
        "&& i.naturalHeight > 0; }",
        timeout=PAGE_READY_MS,
    )
    opened_s = time.perf_counter() - started
    page.screenshot(path=tmp_path / "plan-65536.png", full_page=True)
    axes = page.inner_text("#axes")
    for axis in pod["axes_detail"]:
        assert axis["name"] in axes and axis["link"] in axes, (axis, axes)
    assert "dcn" in axes and "ici" in axes
    assert "65536" in page.inner_text("main")
    assert page.locator("#memory").count() == 1 and page.locator("#estimate").count() == 1
    assert page.locator("#params tbody tr").count() == min(200, len(pod["params"]))
    heights = page.evaluate(
        "() => [...document.querySelectorAll('img, canvas, svg')].map(e => "
        "[e.tagName, e.getBoundingClientRect().height, e.naturalHeight || 0])"
    )
    assert heights and all(h <= 4000 and n <= 4000 for _, h, n in heights), heights
    # The bound: the page opens in under 3 s in the test browser.
    assert opened_s < 3.0, f"the 65,536-device plan page took {opened_s:.2f} s"
    page.watch.assert_clean()


def test_a_live_plan_page_shows_axes_and_picture(page, service):
    live = service.data["live"]
    _open(page, f"{service.base_url}/plans/{live['id']}")
    page.wait_for_selector("#layout")
    rows = page.locator("#axes tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).locator("td").nth(0).inner_text() == "data"
    assert rows.nth(1).locator("td").nth(1).inner_text() == "4"
    page.watch.assert_clean()


def test_the_job_page_charts_100k_steps_downsampled(page, service, tmp_path):
    _open(page, f"{service.base_url}/jobs/{service.data['job']}")
    figures = page.locator("#charts figure.metric")
    assert figures.count() == 2
    assert sorted(page.get_attribute("#charts", "data-metrics").split(",")) == ["accuracy", "loss"]
    for i in range(2):
        figure = figures.nth(i)
        # one uPlot chart per metric: one metric series, drawn as max, min (the band) and mean
        assert figure.locator(".uplot canvas").count() == 1
        assert figure.get_attribute("data-series") == "1"
        assert figure.get_attribute("data-plot-series") == "3"
        assert figure.locator(".u-legend .u-series").count() == 4  # step + max, min, mean
        points = int(figure.get_attribute("data-points"))
        assert 100 <= points <= 2000, points  # buckets, not 100,000 points
    info = page.inner_text("#view p.muted")
    assert "downsampled" in info, info
    painted = page.evaluate(
        "() => { const c = document.querySelector('figure[data-metric=loss] canvas');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }"
    )
    assert painted > 1000, painted
    page.screenshot(path=tmp_path / "job.png", full_page=True)
    # Zoom: drag over the middle of the loss chart (uPlot's drag-to-zoom); the page asks
    # the server for that step range and redraws from it.
    before = page.get_attribute("figure[data-metric=loss]", "data-points")
    box = page.locator("figure[data-metric=loss] .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=4)
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('#view p.muted').textContent.includes('steps ')"
    )
    zoomed = page.inner_text("#view p.muted")
    first, last = (int(x) for x in zoomed.split("steps ")[1].split(".")[0].split("\u2013"))
    assert 30_000 < first < last < 70_000 and last - first < 30_000, zoomed
    page.wait_for_function(
        "b => document.querySelector('figure[data-metric=loss]').dataset.points !== b", arg=before
    )
    page.screenshot(path=tmp_path / "job-zoomed.png", full_page=True)
    page.watch.assert_clean()


def test_the_session_page_with_login(page, service, tmp_path):
    session = service.data["session"]
    _open(page, f"{service.base_url}/sessions/{session['id']}")
    assert "5" in page.inner_text("#session-facts")
    # The 5 steps ran before this tab opened: the curve is the service's loss history.
    figure = "figure[data-metric=loss]"
    assert page.get_attribute(figure, "data-points") == "5"
    assert page.get_attribute(figure, "data-series") == "1"
    assert page.get_attribute(figure, "data-plot-series") == "1"
    page.fill("#token", TOKEN)
    page.click("#sign-in")
    assert page.evaluate("() => sessionStorage.getItem('datarax-token')") == TOKEN
    assert TOKEN not in page.url
    page.click("form.run button")
    page.wait_for_function(
        "() => document.querySelector('#session-facts').textContent.includes('15')"
    )
    page.wait_for_function(
        "f => document.querySelector(f).dataset.points === '15'", arg=figure, timeout=10_000
    )
    with _api(service) as client:
        history = client.get(f"/v1/sessions/{session['id']}").json()["loss_history"]
    assert [step for step, _ in history] == list(range(1, 16))
    painted = page.evaluate(
        "f => { const c = document.querySelector(f + ' canvas');"
        " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }",
        figure,
    )
    assert painted > 1000, painted
    page.screenshot(path=tmp_path / "session.png", full_page=True)
    page.watch.assert_clean()


def test_the_devices_page(page, service):
    _open(page, f"{service.base_url}/devices")
    page.wait_for_selector("#device-table")
    assert page.locator("#device-table tbody tr").count() == 8
    assert "ready" in page.inner_text("#health")
    page.watch.assert_clean()


def test_docs_list_every_operation_offline(page, service, tmp_path):
    spec = httpx.get(service.base_url + "/openapi.json").json()
    operations = sum(
        1 for ops in spec["paths"].values() for m in ops if m in ("get", "post", "delete", "patch")
    )
    page.goto(service.base_url + "/docs")
    page.wait_for_selector(".opblock", timeout=PAGE_READY_MS)
    assert page.locator(".opblock").count() == operations
    page.screenshot(path=tmp_path / "docs.png")
    page.watch.assert_clean()


def test_redoc_renders_offline(page, service, tmp_path):
    page.goto(service.base_url + "/redoc")
    page.wait_for_selector("text=datarax mesh service", timeout=PAGE_READY_MS)
    page.screenshot(path=tmp_path / "redoc.png")
    for _ in range(50):  # the refusal's event may trail the render
        if page.watch.blocked:
            break
        page.wait_for_timeout(100)
    page.watch.assert_local()
    # ReDoc's sidebar footer points an <img> at its CDN logo; the page's CSP refuses it
    # before any request is made, and the browser logs that refusal, nothing else.
    others = [e for e in page.watch.errors if "cdn.redoc.ly" not in e]
    assert not others, others


def test_a_real_run_plan_page_shows_every_memory_term_and_launches(page, service, tmp_path):
    # Runs last: the home page test counts the fixture's plans.
    body = {
        "name": "llama-8b-v6e8",
        "hardware": "tpu-v6e",
        "topology": "2x4",
        "ici": {"fsdp": 8},
        "batch_shape": [24, 8192],
        "model": {
            "name": "llama3.1-8b",
            "param_dtype": "float32",
            "remat": "custom",
            "remat_custom": dict.fromkeys(
                ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "out_proj"),
                "offload",
            ),
        },
    }
    with _api(service) as client:
        plan = client.post("/v1/meshes", json=body).json()
    _open(page, f"{service.base_url}/plans/{plan['id']}")
    memory = page.inner_text("#memory")
    for term in ("params", "optimizer", "grads", "activations", "batch", "temporaries",
                 "host offload"):  # fmt: skip
        assert term in memory, (term, memory)
    estimate = page.inner_text("#estimate")
    assert "step (predicted)" in estimate and "roofline" in estimate
    assert "x the roofline" in estimate and "flash attention" in estimate
    # the compile-check form starts from the plan's own model
    draft = page.input_value("form.compile textarea")
    assert '"name":"llama3.1-8b"' in draft and '"remat":"custom"' in draft
    page.fill("#token", TOKEN)
    page.click("#sign-in")
    page.select_option("#launch-target", "jobset")
    page.fill("#launch input[aria-label=queue]", "tpu-queue")
    page.click("#launch form button")
    page.wait_for_function(
        "() => document.querySelector('#launch-output').textContent.includes('JobSet')"
    )
    output = page.inner_text("#launch-output")
    assert "gke-tpu-topology" in output and "tpu-queue" in output
    assert page.locator("#launch button:text('Copy')").is_enabled()
    page.screenshot(path=tmp_path / "plan-real-run.png", full_page=True)
    page.watch.assert_clean()
