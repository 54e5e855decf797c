"""The dashboard in a real browser: headless Chromium (Debian's package) driven by
Playwright, against the real ``datarax-serve`` with real data made through the API.

Runs when ``/usr/bin/chromium`` (or ``DATARAX_CHROMIUM``) and Playwright are there; skips
loudly when not (one line; ``make test`` installs Chromium where it can), and fails when
``CI=true``. Screenshots go to each test's temp dir (or to ``DATARAX_SCREENSHOTS`` when
set), for a person to look at: every page at 1280x800 and at 390x844 (a phone).

Timings are measured and printed (``-s`` shows them), never asserted.
"""

from __future__ import annotations

import os
import shutil
import time
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
SHOTS = os.environ.get("DATARAX_SCREENSHOTS")
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
LAGGING_SOURCE = "h2"
JOB_STEPS = 100_000
BATCH = 1000  # points per batch push: the contract's maximum
PAGE_READY_MS = 30_000


def _need(what: str) -> None:
    # One line in pytest's -ra summary (a warning here would be an error: filterwarnings=error).
    message = (
        f"browser tests need {what}; `make test` installs it as root, "
        "or: sudo apt-get install -y chromium"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message + " -- CI=true, so this is a failure, not a skip")
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


def _push_lagging_job(client: httpx.Client, job: str) -> str:
    """Four hosts push steps 0..11; host h2 stopped after step 5 (steps 6..11 wait for it)."""
    for step in range(12):
        for host in range(4):
            if f"h{host}" == LAGGING_SOURCE and step > 5:
                continue
            answer = client.post(
                f"/v1/jobs/{job}/metrics",
                json={"step": step, "source": f"h{host}", "sources": 4,
                      "metrics": {"loss": [1.0 + host, 2.0]}},
            )  # fmt: skip
            assert answer.status_code in (200, 201), answer.text
    return job


def _push_tiny_job(client: httpx.Client, job: str) -> str:
    """A learning rate from -1.25e-4 to 5e-4: y-axis labels like "-1e-4" must not be cut."""
    points = [
        {"step": i, "metrics": {"lr": [-1.25e-4 + 6.25e-4 * i / 199] * 2}} for i in range(200)
    ]
    answer = client.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    assert answer.status_code in (200, 201), answer.text
    return job


def _push_linked_job(client: httpx.Client, job: str, plan: str) -> str:
    """A job that pushes its step time and is linked to the pod's plan: 50 steps of 3 s."""
    points = [{"step": i, "metrics": {"step_time": [3.0, 3.0]}} for i in range(50)]
    answer = client.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    assert answer.status_code in (200, 201), answer.text
    linked = client.patch(f"/v1/jobs/{job}", json={"plan": plan})
    assert linked.status_code == 200, linked.text
    return job


@pytest.fixture(scope="module")
def open_service(tmp_path_factory):
    """A server without a token and without data: the empty, open dashboard."""
    tmp = tmp_path_factory.mktemp("dashboard-open")
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log") as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard-e2e")
    env = {"DATARAX_API_TOKEN": TOKEN}
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as server:
        server.wait_ready()
        with _api(server) as client:
            data = {}
            unnamed = client.post(
                "/v1/meshes",
                json={"hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8},
                      "batch_shape": [8, 2048],
                      "model": {"name": "llama3.1-8b", "seq_len": 2048}},
            )  # fmt: skip
            assert unnamed.status_code == 201, unnamed.text
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
            data["lagging"] = _push_lagging_job(client, "multi-host")
            data["tiny"] = _push_tiny_job(client, "tiny-lr")
            data["linked"] = _push_linked_job(client, "linked-run", data["pod"]["id"])
            data["predicted"] = data["pod"]["step_estimate"]["step_s"]
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


def _shot(page, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot, into DATARAX_SCREENSHOTS when set (else the test's dir)."""
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    return path


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=PAGE_READY_MS)
    assert page.get_attribute("body", "data-ready") == "true", page.inner_text("main")


def test_home_lists_plans_newest_first_and_searches(page, service, tmp_path):
    _open(page, service.base_url + "/")
    rows = page.locator("table.plans tbody tr")
    rows.first.wait_for()
    names = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    # an unnamed plan reads as its hardware and slice, its mesh and its model, not "–"
    assert names == ["pod-65536", "abs-1024", "live-2x4", "tpu-v6e 2x4 · fsdp 8 · llama3.1-8b"], (
        names
    )
    assert rows.nth(2).locator(".badge").inner_text() == "live"
    assert rows.nth(1).locator(".badge").inner_text() == "abstract"
    page.fill("#plan-search", "abs-1024")
    assert page.locator("table.plans tbody tr").count() == 1
    page.locator("table.jobs tbody tr").first.wait_for()
    assert "train-100k" in page.inner_text("table.jobs")
    page.screenshot(path=tmp_path / "home.png", full_page=True)
    page.watch.assert_clean()


def _open_timed(page, url: str) -> dict:
    """Opens a plan page; its wall time and the page's own marks (ms since navigation):
    ``shown`` when the plan's facts and tables are on the page, ``drawn`` when the picture
    is."""
    started = time.perf_counter()
    _open(page, url)
    page.wait_for_selector("#layout", timeout=PAGE_READY_MS)
    wall = time.perf_counter() - started
    marks = page.evaluate(
        "() => [Number(document.body.dataset.shownMs), "
        "Number(document.querySelector('#layout-box').dataset.drawnMs)]"
    )
    return {"wall_s": wall, "shown_s": marks[0] / 1000, "drawn_s": marks[1] / 1000}


def _block_labels(page) -> list[str]:
    return page.eval_on_selector_all(
        "#layout a.block", "as => as.map(a => a.querySelector('text').textContent)"
    )


def test_the_65536_device_plan_page(page, service, tmp_path):
    pod = service.data["pod"]
    url = f"{service.base_url}/plans/{pod['id']}"
    cold = _open_timed(page, url)  # the first view draws the picture on the server
    warm = _open_timed(page, url)
    # The bound is 1.5 s; measured here, not asserted (house rule): printed for
    # the report and the benchmarks.
    print(
        f"\n65,536-device plan page: cold {cold['wall_s']:.2f} s wall (facts shown at "
        f"{cold['shown_s']:.2f} s, picture at {cold['drawn_s']:.2f} s); warm "
        f"{warm['wall_s']:.2f} s wall (shown {warm['shown_s']:.2f} s, picture "
        f"{warm['drawn_s']:.2f} s)"
    )
    _shot(page, tmp_path, "plan-65536")
    axes = page.inner_text("#axes")
    for axis in pod["axes_detail"]:
        assert axis["name"] in axes and axis["link"] in axes, (axis, axes)
    # One unit everywhere: bytes per second with SI prefixes, in the table and the picture.
    assert "6.25 GB/s" in axes and "90 GB/s" in axes and "GiB/s" not in axes
    picture = page.text_content("#layout")
    assert "6.25 GB/s" in picture and "90 GB/s" in picture and "e+09" not in picture
    assert "65,536" in page.inner_text("main")
    assert page.locator("#memory").count() == 1 and page.locator("#estimate").count() == 1
    assert page.locator("#params tbody tr").count() == min(200, len(pod["params"]))
    # The overview: 64 blocks of 4 slices, legible as drawn (no scaling down).
    labels = _block_labels(page)
    assert len(labels) == 64 and labels[0] == "slices 0\u20133", labels[:3]
    sizes = page.eval_on_selector_all(
        "#layout text", "ts => ts.map(t => t.getBoundingClientRect().height)"
    )
    assert sizes and min(sizes) >= 9, min(sizes)  # CSS px as shown: 10 px text, not 5 px
    box = page.eval_on_selector("#layout", "s => [s.clientWidth, s.clientHeight]")
    assert box[0] <= 1280 and box[1] <= 1000, box
    # No device table of 65,536 rows unless asked for one.
    assert page.locator("#shard-table").count() == 0
    page.watch.assert_clean()


def test_a_block_of_the_big_plan_opens_its_devices(page, service, tmp_path):
    pod = service.data["pod"]
    _open(page, f"{service.base_url}/plans/{pod['id']}")
    page.wait_for_selector("#layout a.block")
    page.locator("#layout a.block").nth(1).click()
    page.wait_for_function("() => location.search === '?slice=4-7'")
    page.wait_for_function("() => document.querySelectorAll('#layout a.block').length === 4")
    assert _block_labels(page) == ["slice 4", "slice 5", "slice 6", "slice 7"]
    assert "slices 4\u20137" in page.inner_text(".trail")
    page.locator("#layout a.block").nth(2).click()
    page.wait_for_function("() => location.search === '?slice=6'")
    page.wait_for_function(
        "() => document.querySelector('#layout-box').dataset.scope === 'slice=6'"
        " && document.querySelectorAll('#layout g').length === 256"
    )
    cells = page.eval_on_selector_all(
        "#layout g", "gs => gs.map(g => g.querySelectorAll('text')[2].textContent)"
    )
    assert {c.split()[0] for c in cells} == {"s6"} and len({c.split()[1] for c in cells}) == 64
    _shot(page, tmp_path, "plan-65536-slice-6")
    # The address is the picture's name: Back returns to the 4 slices, a reload keeps it.
    page.go_back()
    page.wait_for_function("() => document.querySelectorAll('#layout a.block').length === 4")
    page.reload()
    page.wait_for_selector("body[data-ready]")
    page.wait_for_function("() => document.querySelectorAll('#layout a.block').length === 4")
    # Finding one device loads the plan's devices once, on demand.
    device = "200044"  # slice 1's 45th chip (TPU slices number their devices 100000+)
    page.fill("input[aria-label='find a device']", device)
    page.wait_for_selector("#shard-table tbody tr")
    assert page.locator("#shard-table tbody tr").count() == 1
    assert page.inner_text("#shard-table tbody tr").split()[0] == device
    page.watch.assert_clean()


def test_a_live_plan_page_shows_axes_and_picture(page, service):
    live = service.data["live"]
    _open(page, f"{service.base_url}/plans/{live['id']}")
    page.wait_for_selector("#layout g")
    assert page.locator("#layout g").count() == 8 and page.locator("#layout a").count() == 0
    page.wait_for_selector("#shard-table tbody tr")  # 8 devices: loaded with the page
    assert page.locator("#shard-table tbody tr").count() == 8
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
        # the legend shows values under the cursor or nothing, never a dash (issue 40)
        assert "\u2013" not in figure.locator(".u-legend").inner_text()
        box = figure.locator(".u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        hovered = figure.locator(".u-legend").inner_text()
        assert "\u2013" not in hovered and any(ch.isdigit() for ch in hovered), hovered
        points = int(figure.get_attribute("data-points"))
        assert 100 <= points <= 2000, points  # buckets, not 100,000 points
    info = page.inner_text("#job-info")
    assert "downsampled" in info and "2 metrics" in info, info
    # the band is the spread over devices, and the straggling device is named (issue 40)
    assert "band = devices' min\u2026max" in info, info
    loss = page.locator("figure[data-metric=loss]")
    assert "loss device max" in loss.locator(".u-legend").inner_text()
    note = loss.locator(".chart-caption .straggler").inner_text()
    assert note.startswith("straggler: device ") and "furthest above the mean at step" in note, note
    # the spike at step 61,234 (3.0 over every device) is where the highest stood furthest
    # above the mean; device 1 held the highest value there (0.01 * 1 + 0.05 * 4)
    assert "at step 61234: device 1," in note, note
    assert "lagging" not in page.inner_text("#job-facts") and not page.is_visible("#job-lag")
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
        "() => document.querySelector('#job-info').textContent.includes('steps ')"
    )
    zoomed = page.inner_text("#job-info")
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


def test_a_lagging_host_shows_on_the_home_and_job_pages(page, service, tmp_path):
    job = service.data["lagging"]
    _open(page, service.base_url + "/")
    row = page.locator("table.jobs tbody tr", has_text=job)
    row.wait_for()
    assert row.locator(".badge").inner_text() == "lagging"  # not "active"
    assert f"{LAGGING_SOURCE} (step 11)" in row.inner_text()
    others = page.locator("table.jobs tbody tr", has_text=service.data["job"])
    assert others.locator(".badge").inner_text() in ("active", "stale")
    _open(page, f"{service.base_url}/jobs/{job}")
    page.wait_for_selector("#job-lag:not([hidden])")
    lag = page.inner_text("#job-lag")
    assert "Lagging" in lag and f"waiting for {LAGGING_SOURCE}" in lag and "step 11" in lag, lag
    assert "up to step 5" in lag, lag
    assert "lagging" in page.inner_text("#job-facts")
    _shot(page, tmp_path, "job-lagging")
    page.watch.assert_clean()


def test_a_job_linked_to_its_plan_shows_predicted_against_measured(page, service, tmp_path):
    _open(page, f"{service.base_url}/jobs/{service.data['linked']}")
    page.wait_for_selector("#job-facts a")
    facts = page.inner_text("#job-facts")
    assert "predicted step" in facts and "measured step (median of 50)" in facts, facts
    assert "3 s" in facts and "prediction error" in facts, facts
    predicted = service.data["predicted"]
    assert f"{predicted / 3.0 - 1:+.1%}" in facts.replace("+-", "-"), facts
    link = page.locator("#job-facts a")
    assert link.get_attribute("href") == f"/plans/{service.data['pod']['id']}"
    # the step-time chart draws the plan's prediction as a second line
    figure = 'figure[data-metric="step_time"]'
    page.wait_for_function(f"() => document.querySelector('{figure}')?.dataset.series === '2'")
    assert "predicted (plan)" in page.inner_text(f"{figure} .u-legend")
    _shot(page, tmp_path, "job-linked")
    page.watch.assert_clean()


def test_small_values_keep_whole_y_axis_labels(page, service, tmp_path):
    _open(page, f"{service.base_url}/jobs/{service.data['tiny']}")
    figure = "figure[data-metric=lr]"
    page.wait_for_selector(f"{figure} canvas")
    # Ink of the axis labels exists, and none touches the canvas' left edge (a label cut
    # at the edge, as ".00e-4" was, inks its first columns).
    ink = page.evaluate(
        """f => { const c = document.querySelector(f + ' canvas');
          const over = document.querySelector(f + ' .u-over').getBoundingClientRect();
          const left = Math.round((over.left - c.getBoundingClientRect().left) * devicePixelRatio);
          const d = c.getContext('2d').getImageData(0, 0, Math.max(left, 1), c.height).data;
          let edge = 0, labels = 0;
          for (let i = 0; i < d.length; i += 4) {
            if (d[i + 3] === 0) continue;
            labels++;
            if ((i / 4) % left < 3) edge++;
          }
          return {left, edge, labels}; }""",
        figure,
    )
    assert ink["labels"] > 100 and ink["edge"] == 0, ink
    assert "lr: 5.00e-4" in page.inner_text(figure)
    _shot(page, tmp_path, "job-tiny-lr")
    page.watch.assert_clean()


def _bucket(start: int, low: float, high: float, mean: float, last: float) -> dict:
    stats = {"min": low, "max": high, "mean": mean, "last": last}
    return {"start_step": start, "end_step": start + 9, "metrics": {"loss": stats}}


_POINTS = [{"step": 1, "reduced": {"loss": 1.0}}, {"step": 2, "reduced": {"loss": 0.5}}]
_BUCKETS = [_bucket(0, 1, 3, 2, 1), _bucket(10, 0, 2, 1, 0)]
HISTORY_SHAPES = {
    # a plain read, as today and with the "kind" another release adds
    "points": {"job": "j", "downsampled": False, "points": _POINTS},
    "points-kind": {"job": "j", "kind": "points", "buckets": None, "points": _POINTS},
    # a downsampled read: buckets of min/max/mean/last, with and without "kind"
    "buckets": {"job": "j", "downsampled": True, "points": None, "buckets": _BUCKETS},
    "buckets-kind": {"job": "j", "kind": "buckets", "points": [], "buckets": _BUCKETS},
    "empty": {"job": "j", "kind": "points", "points": []},
}


@pytest.mark.parametrize("shape", list(HISTORY_SHAPES))
def test_the_history_chart_reads_points_and_buckets(page, open_service, shape):
    _open(page, open_service.base_url + "/devices")
    series = page.evaluate(
        "h => DataraxDashboard.seriesOf(h).map(s => [s.name, s.steps, s.min, s.max, s.mean])",
        HISTORY_SHAPES[shape],
    )
    if shape == "empty":
        assert series == []
    elif shape.startswith("points"):
        assert series == [["loss", [1, 2], [1, 0.5], [1, 0.5], [1, 0.5]]]
    else:
        assert series == [["loss", [9, 19], [1, 0], [3, 2], [2, 1]]]
    flag = page.evaluate("h => DataraxDashboard.downsampled(h)", HISTORY_SHAPES[shape])
    assert flag is shape.startswith("buckets")


def test_the_history_chart_draws_the_spread_and_names_the_straggler(page, open_service):
    _open(page, open_service.base_url + "/devices")
    spread = {"min": 0.5, "max": 4.0, "min_device": 2, "max_device": 7}
    history = {
        "job": "j",
        "kind": "points",
        "points": [
            {"step": 1, "reduced": {"loss": 1.0, "lr": 0.1}, "spread": {"loss": spread}},
            {"step": 2, "reduced": {"loss": 0.9, "lr": 0.1},
             "spread": {"loss": {**spread, "max": 1.2, "max_device": 3}}},
            {"step": 3, "reduced": {"loss": 0.8, "lr": 0.1},
             "spread": {"loss": {**spread, "max": 1.0, "max_device": 7}}},
        ],
    }  # fmt: skip
    series = page.evaluate(
        "h => DataraxDashboard.seriesOf(h).map(s => [s.name, s.min, s.max, s.mean, s.note || ''])",
        history,
    )
    assert series == [
        ["loss", [0.5, 0.5, 0.5], [4.0, 1.2, 1.0], [1.0, 0.9, 0.8],
         "straggler: device 7 (highest in 2 of 3 steps; furthest above the mean at step 1: "
         "device 7, 4 against 1)"],
        ["lr", [0.1] * 3, [0.1] * 3, [0.1] * 3, ""],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 jobs"), (1, "1 job"), (2, "2 jobs"), (65536, "65,536 jobs")]
)
def test_counts_are_plural_only_when_more_than_one(page, open_service, n, text):
    _open(page, open_service.base_url + "/devices")
    assert page.evaluate("n => DataraxDashboard.count(n, 'job')", n) == text


def test_an_empty_open_server(browser, open_service, tmp_path):
    """No token set: no sign-in box; empty tables say so; no stray "null"; plurals."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.watch = Watch(page)
    try:
        _open(page, open_service.base_url + "/")
        page.wait_for_selector("table.sessions")
        assert not page.is_visible("#login") and not page.is_visible("#token")
        for table, text in (("plans", "no plans yet"), ("jobs", "no jobs yet"),
                            ("sessions", "no sessions")):  # fmt: skip
            assert text in page.inner_text(f"table.{table} tbody tr.empty"), table
        body = page.inner_text("body")
        assert "null" not in body and "undefined" not in body and "NaN" not in body, body
        assert "0 plans" in body and "0 jobs" in body and "0 sessions" in body
        _shot(page, tmp_path, "home-empty")
        with httpx.Client(base_url=open_service.base_url, timeout=60) as client:
            made = client.post("/v1/meshes", json={"axes": {"data": 8}, "name": "one"})
            assert made.status_code == 201, made.text
            pushed = client.post(
                "/v1/jobs/one/metrics", json={"step": 0, "metrics": {"loss": [1.0]}}
            )
            assert pushed.status_code == 201, pushed.text
        page.reload()
        page.wait_for_selector("table.plans tbody tr:not(.empty)")
        page.wait_for_selector("table.jobs tbody tr:not(.empty)")
        body = page.inner_text("body")
        assert "1 plan" in body and "1 plans" not in body and "1 job" in body
        assert "1 jobs" not in body and "null" not in body
        assert not page.is_visible("#login")
        # A plan page of the open server: no sign-in either; the docs are a click away.
        plan_id = made.json()["id"]
        _open(page, f"{open_service.base_url}/plans/{plan_id}")
        assert not page.is_visible("#login")
        assert page.get_attribute("#docs-link", "href") == "/docs" and page.is_visible("#docs-link")
        page.click("#docs-link")
        page.wait_for_selector(".opblock", timeout=PAGE_READY_MS)
        page.watch.assert_local()
    finally:
        context.close()


def _pages(service) -> dict[str, tuple[str, list[str]]]:
    """Every page of the dashboard: its address and the elements that must show."""
    data = service.data
    return {
        "home": ("/", ["table.plans", "table.jobs", "table.sessions", "#login", "#docs-link"]),
        "plan-live": (f"/plans/{data['live']['id']}", ["#axes", "#layout-box", "#memory"]),
        "plan-65536": (f"/plans/{data['pod']['id']}",
                       ["#axes", "#layout-box", "#memory", "#estimate", "#launch"]),
        "plan-65536-slice": (f"/plans/{data['pod']['id']}?slice=1", ["#layout-box", ".trail"]),
        "job": (f"/jobs/{data['job']}", ["figure[data-metric=loss] canvas", "#job-facts"]),
        "job-lagging": (f"/jobs/{data['lagging']}", ["#job-lag", "#job-facts"]),
        "session": (f"/sessions/{data['session']['id']}",
                    ["#session-facts", "figure[data-metric=loss] canvas", "form.run button"]),
        "devices": ("/devices", ["#device-table", "#health"]),
    }  # fmt: skip


PAGE_NAMES = ["home", "plan-live", "plan-65536", "plan-65536-slice", "job", "job-lagging",
              "session", "devices"]  # fmt: skip


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("name", PAGE_NAMES)
def test_every_page_fits_its_screen(browser, service, tmp_path, name, viewport):
    """Nothing overflows the page sideways (wide tables and the picture scroll inside their
    cards), and the page's key elements are visible and inside the screen's width."""
    width, height = VIEWPORTS[viewport]
    path, selectors = _pages(service)[name]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.watch = Watch(page)
    try:
        _open(page, service.base_url + path)
        for selector in selectors:
            page.wait_for_selector(selector, state="visible", timeout=PAGE_READY_MS)
        page.wait_for_load_state("networkidle")
        scroll_width, inner = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]"
        )
        _shot(page, tmp_path, f"{name}-{width}x{height}")
        assert scroll_width <= inner, f"{name} at {width}px: the page is {scroll_width}px wide"
        for selector in selectors:
            element = page.locator(selector).first
            assert element.is_visible(), selector
            box = element.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= inner + 0.5, (selector, box)
        page.watch.assert_clean()
    finally:
        context.close()


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
