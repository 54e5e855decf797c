// The datarax dashboard: one page that renders what its address names
// (/, /plans/{id}, /jobs/{job}, /sessions/{id}, /devices), from the service's own API.
// The API token lives in sessionStorage and travels only in the Authorization header.
// Polling is cheap: each poll sends If-None-Match, and a 304 changes nothing.
"use strict";

(() => {
  const TOKEN_KEY = "datarax-token";
  const POLL_MS = 5000;
  const view = document.getElementById("view");
  const problemBox = document.getElementById("problem");
  const { Chart, fmt } = DataraxChart;

  // ------------------------------------------------------------------ API access

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem || {};
    }
  }

  // Returns {status, etag, data, headers}; data is null on 304. Throws ApiError on 4xx/5xx.
  async function api(path, { method = "GET", body, etag, raw = false } = {}) {
    const headers = { Accept: raw ? "*/*" : "application/json" };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    if (etag) headers["If-None-Match"] = etag;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
    if (res.status === 304) return { status: 304, etag, data: null, headers: res.headers };
    if (!res.ok) {
      let problem = null;
      try { problem = await res.json(); } catch (_) { /* not JSON */ }
      throw new ApiError(res.status, problem);
    }
    const data = raw ? await res.blob() : res.status === 204 ? null : await res.json();
    return { status: res.status, etag: res.headers.get("ETag"), data, headers: res.headers };
  }

  function showProblem(err) {
    if (!err) { problemBox.hidden = true; return; }
    const p = err.problem || {};
    let text = err.message;
    if (err.status === 401) {
      text = "This needs the API token: enter it above and sign in. (" + text + ")";
      showLogin();
    }
    problemBox.textContent = p.code ? `${text} [${p.code}]` : text;
    problemBox.hidden = false;
  }

  // -------------------------------------------------------------------- helpers

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    return put(node, "append", children);
  }

  // node.append / node.replaceChildren without the DOM's habit of writing null, undefined
  // and false as text ("null" under a table): those children are left out.
  function put(node, how, children) {
    const kids = children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
      .map((c) => (c instanceof Node ? c : document.createTextNode(String(c))));
    node[how](...kids);
    return node;
  }
  const fill = (node, ...children) => put(node, "replaceChildren", children);
  const add = (node, ...children) => put(node, "append", children);

  // "1 job", "2 jobs", "65,536 devices".
  function count(n, word, many) {
    const v = Number(n);
    return `${isFinite(v) ? v.toLocaleString("en-US") : "–"} ${v === 1 ? word : many || `${word}s`}`;
  }

  // A table in its own scroller; on a phone each row stacks into "column: value" lines
  // (every cell carries its column's name in data-label, app.css shows it), so no column
  // hides off the screen. No rows: one "none" line instead of an empty table body.
  function table(columns, rows, attrs = {}, empty = "none") {
    const body = rows.length
      ? rows.map((r) => el("tr", {}, r.map((v, i) => el("td", { "data-label": columns[i] }, v))))
      : [el("tr", { class: "empty" }, el("td", { colspan: String(columns.length), class: "muted", text: empty }))];
    return el("div", { class: columns.length > 3 ? "scroll wide" : "scroll" }, el("table", attrs,
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", { text: c })))),
      el("tbody", {}, body)));
  }

  // Bytes per second with SI prefixes (datasheets quote links in GB/s), 3 significant
  // digits: the same text as the layout picture's (app/services/layout_svg.format_rate).
  function rate(n) {
    if (n === null || n === undefined || !isFinite(n)) return "–";
    const units = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    let i = 0, v = Number(n);
    while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
    return `${Number(v.toPrecision(3))} ${units[i]}`;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Number(n);
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function seconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 1e-3) return `${(s * 1e6).toFixed(1)} µs`;
    if (s < 1) return `${(s * 1e3).toFixed(2)} ms`;
    return `${Number(s).toFixed(3)} s`;
  }

  function ago(iso) {
    if (!iso) return "never";
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (!isFinite(s)) return iso;
    if (s < 90) return `${Math.max(0, Math.round(s))} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }

  function shape(a) {
    return Array.isArray(a) ? `[${a.join(", ")}]` : a === null || a === undefined ? "–" : String(a);
  }

  function spec(a) {
    return Array.isArray(a) ? `(${a.map((x) => (x === null ? "None" : Array.isArray(x) ? `(${x.join(", ")})` : x)).join(", ")})` : "–";
  }

  // The API's own document says which operations exist, so the dashboard never probes a
  // path that this server does not have.
  let document_ = null;
  function openapi() {
    if (!document_) document_ = api("/openapi.json").then((r) => r.data || {});
    return document_;
  }
  async function hasOperation(method, path) {
    const ops = (await openapi()).paths || {};
    return Boolean(ops[path] && ops[path][method]);
  }

  const pollers = [];
  function every(ms, fn) {
    const id = setInterval(() => { if (!document.hidden) fn().catch(showProblem); }, ms);
    pollers.push(id);
  }

  // ------------------------------------------------------------------ login

  // The sign-in box shows only where it is needed: when the server requires a token (its
  // OpenAPI document declares a security scheme only then), when a token is stored, or
  // after a 401.
  let showLogin = () => {};
  function setupLogin() {
    const form = document.getElementById("login");
    const input = document.getElementById("token");
    const out = document.getElementById("sign-out");
    const state = document.getElementById("login-state");
    let needed = false;
    const render = () => {
      const on = Boolean(token());
      form.hidden = !(needed || on);
      out.hidden = !on;
      input.hidden = on;
      document.getElementById("sign-in").hidden = on;
      state.textContent = on ? "signed in" : "";
    };
    showLogin = () => { needed = true; render(); };
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
      input.value = "";
      render();
      showProblem(null);
    });
    out.addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); render(); });
    render();
    openapi().then((doc) => {
      if (Object.keys((doc.components || {}).securitySchemes || {}).length) showLogin();
    }).catch(() => {});
  }

  // ------------------------------------------------------------------ home

  async function renderHome() {
    document.title = "datarax dashboard";
    const plansBody = el("div", { id: "plans-list" });
    const search = el("input", { id: "plan-search", type: "search", placeholder: "search name, id, platform, axes" });
    const jobsBody = el("div", { id: "jobs-list" });
    const sessionsBody = el("div", { id: "sessions-list" });
    fill(view,
      el("section", { id: "plans", class: "card" }, el("h2", { text: "Plans" }), search, plansBody),
      el("section", { id: "jobs", class: "card" }, el("h2", { text: "Jobs" }), jobsBody),
      el("section", { id: "sessions", class: "card" }, el("h2", { text: "Sessions" }), sessionsBody),
    );

    // An unnamed plan reads as what it is: its hardware and slice, its mesh, its model.
    const unnamedPlan = (p) => {
      const where = p.hardware ? `${p.hardware}${p.topology ? ` ${String(p.topology).split(":").pop()}` : ""}` : p.platform;
      const mesh = Object.entries(p.axes || {}).map(([k, v]) => `${k} ${v}`).join(" × ");
      const model = p.model ? p.model.name || p.model.kind : null;
      return [where, mesh, model].filter(Boolean).join(" · ") || "unnamed";
    };
    let plans = [], total = 0, plansTag = null;
    const drawPlans = () => {
      const q = search.value.trim().toLowerCase();
      const shown = plans.filter((p) => !q || [p.name, p.id, p.platform, p.hardware, Object.keys(p.axes || {}).join(" "), p.live ? "live" : "abstract"]
        .some((f) => f && String(f).toLowerCase().includes(q)));
      fill(plansBody,
        el("p", { class: "muted", text: `${count(total, "plan")}${total > 1 ? ", newest first" : ""}${q ? `; ${shown.length.toLocaleString("en-US")} of the ${plans.length.toLocaleString("en-US")} loaded match` : ""}` }),
        table(["name", "id", "kind", "devices", "axes", "created"], shown.map((p) => [
          p.name || el("span", { class: "muted unnamed", text: unnamedPlan(p) }),
          el("a", { href: `/plans/${encodeURIComponent(p.id)}`, text: p.id }),
          el("span", { class: p.live ? "badge live" : "badge", text: p.live ? "live" : "abstract" }),
          Number(p.total_devices).toLocaleString("en-US"),
          Object.entries(p.axes || {}).map(([k, v]) => `${k}=${v}`).join(" × "),
          ago(p.created_at),
        ]), { class: "plans" }, q ? "no plan matches" : "no plans yet: POST /v1/meshes makes one"),
        plans.length < total ? el("button", { text: "More", onclick: () => loadPlans(plans.length) }) : null,
      );
    };
    const loadPlans = async (offset = 0) => {
      const r = await api(`/v1/meshes?view=summary&limit=100&offset=${offset}`, { etag: offset ? null : plansTag });
      if (r.status === 304) return;
      if (!offset) plansTag = r.etag;
      plans = offset ? plans.concat(r.data.items) : r.data.items;
      total = r.data.total;
      drawPlans();
    };
    search.addEventListener("input", drawPlans);

    let jobsTag = null;
    const loadJobs = async () => {
      if (!(await hasOperation("get", "/v1/jobs"))) {
        if (!jobsBody.firstChild) fill(jobsBody, openBox("job", "/jobs/", "this server does not list jobs; open one by name"));
        return;
      }
      const r = await api("/v1/jobs", { etag: jobsTag });
      if (r.status === 304) return;
      jobsTag = r.etag;
      const items = r.data.items || [];
      fill(jobsBody,
        el("p", { class: "muted", text: count(r.data.total ?? items.length, "job") }),
        table(["job", "points", "steps", "last push", "state", "waiting for"], items.map((j) => {
          const state = jobState(j);
          return [
            el("a", { href: `/jobs/${encodeURIComponent(j.job)}`, text: j.job }),
            j.points === undefined ? "–" : Number(j.points).toLocaleString("en-US"),
            `${j.first_step ?? "–"} … ${j.last_step ?? "–"}`,
            ago(j.last_push_at),
            el("span", { class: `badge ${state}`, text: state }),
            lagText(j) || "–",
          ];
        }), { class: "jobs" }, "no jobs yet: POST /v1/jobs/{job}/metrics stores one"),
        openBox("job", "/jobs/", "open a job by name"),
      );
    };

    let sessionsTag = null;
    const loadSessions = async () => {
      if (!(await hasOperation("get", "/v1/sessions"))) {
        if (!sessionsBody.firstChild) fill(sessionsBody, openBox("session", "/sessions/", "this server does not list sessions; open one by id"));
        return;
      }
      const r = await api("/v1/sessions", { etag: sessionsTag });
      if (r.status === 304) return;
      sessionsTag = r.etag;
      const items = r.data.items || [];
      fill(sessionsBody,
        el("p", { class: "muted", text: count(r.data.total ?? items.length, "session") }),
        table(["session", "plan", "step", "last loss"], items.map((s) => [
          el("a", { href: `/sessions/${encodeURIComponent(s.id)}`, text: s.id }),
          s.mesh_id ? el("a", { href: `/plans/${encodeURIComponent(s.mesh_id)}`, text: s.mesh_id }) : "–",
          String(s.step ?? "–"),
          fmt(s.last_loss),
        ]), { class: "sessions" }, "no sessions: POST /v1/meshes/{id}/sessions starts one"),
        openBox("session", "/sessions/", "open a session by id"),
      );
    };

    const all = () => Promise.all([loadPlans(), loadJobs(), loadSessions()]);
    await all();
    if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
    every(POLL_MS * 2, all);
  }

  // A job's state from its GET /v1/jobs entry. "lagging": a multi-source step is missing
  // sources (lagging_sources names them; missing_count counts them) and the job has moved
  // on past it (two or more steps beyond the last complete one) or nothing arrived for
  // LAG_S; a step whose parts are simply still arriving is not lagging.
  const LAG_S = 30;
  function idleSeconds(j) {
    return j.last_push_at ? (Date.now() - Date.parse(j.last_push_at)) / 1000 : Infinity;
  }
  function isLagging(j) {
    if (j.finished || !(j.missing_count > 0) || j.incomplete_step === null || j.incomplete_step === undefined) return false;
    const ahead = j.incomplete_step - (j.last_step ?? -1);
    return ahead >= 2 || idleSeconds(j) >= LAG_S;
  }
  function jobState(j) {
    if (j.finished) return "finished";
    if (isLagging(j)) return "lagging";
    return idleSeconds(j) > 300 ? "stale" : "active";
  }
  function lagText(j) {
    if (!(j.missing_count > 0) || j.incomplete_step === null || j.incomplete_step === undefined) return "";
    const list = j.lagging_sources || [];
    const names = list.length
      ? list.slice(0, 8).join(", ") + (list.length > 8 ? ` and ${list.length - 8} more` : "")
      : count(j.missing_count, "source");
    return `${names} (step ${j.incomplete_step})`;
  }

  function openBox(what, prefix, label) {
    const input = el("input", { type: "text", placeholder: `${what} ${what === "job" ? "name" : "id"}`, "aria-label": label });
    return el("form", { class: "open", onsubmit: (e) => { e.preventDefault(); if (input.value) location.href = prefix + encodeURIComponent(input.value.trim()); } },
      el("span", { class: "muted", text: label + ": " }), input, el("button", { type: "submit", text: "Open" }));
  }

  // ------------------------------------------------------------------ plan page

  // The plan page reads the plan's summary (GET /v1/meshes/{id}?view=summary: a few KB
  // where the 65,536-device plan is ~12 MB), then the picture; the devices themselves load
  // only for small plans or when asked for (the devices card).
  async function renderPlan(id) {
    document.title = `plan ${id}`;
    const base = `/v1/meshes/${encodeURIComponent(id)}`;
    const layout = layoutView(id, base);
    // The summary first, then the picture: drawing a big plan's picture the first time
    // takes the server a moment that the facts and tables need not wait for.
    const r = await api(`${base}?view=summary`);
    layout.load();
    const p = r.data;
    document.title = `plan ${p.name || p.id}`;
    const axesRows = p.axes_detail
      ? p.axes_detail.map((a) => [a.name, String(a.size), String(a.ici ?? "–"), String(a.dcn ?? "–"),
        el("span", { class: `badge link-${a.link}`, text: a.link }), rate(a.bytes_per_s)])
      : Object.entries(p.axes).map(([k, v]) => [k, String(v), "–", "–", "–", "–"]);
    const sections = [
      el("section", { class: "card" },
        el("h2", {}, p.name || p.id, " ", el("span", { class: p.live ? "badge live" : "badge", text: p.live ? "live" : "abstract" })),
        el("dl", { class: "facts" },
          ...fact("id", p.id), ...fact("platform", p.platform), ...fact("hardware", p.hardware),
          ...fact("devices", Number(p.total_devices).toLocaleString("en-US")), ...fact("created", p.created_at),
          ...(p.batch ? [...fact("batch", `${shape(p.batch.shape)} spec ${spec(p.batch.spec)} shard ${shape(p.batch.shard_shape)}`)] : [])),
        el("h3", { text: "Axes" }),
        table(["axis", "size", "ici", "dcn", "link", "bandwidth"], axesRows, { id: "axes" })),
      layout.card,
    ];
    if (p.memory_per_device) sections.push(memoryCard(p.memory_per_device));
    if (p.step_estimate) sections.push(estimateCard(p.step_estimate));
    if (p.params && p.params.length) {
      const shown = p.params.slice(0, 200);
      sections.push(el("section", { class: "card" }, el("h3", { text: `Parameter layouts (${p.params.length})` }),
        table(["path", "shape", "spec", "shard shape", "bytes per device"], shown.map((q) => [q.path, shape(q.shape), spec(q.spec), shape(q.shard_shape), bytes(q.bytes_per_device)]), { id: "params" }),
        p.params.length > shown.length ? el("p", { class: "muted", text: `first ${shown.length} shown` }) : null));
    }
    if (p.warnings && p.warnings.length) {
      sections.push(el("section", { class: "card warn" }, el("h3", { text: "Warnings" }), el("ul", {}, p.warnings.map((w) => el("li", { text: typeof w === "string" ? w : JSON.stringify(w) })))));
    }
    const checks = compileCard(p);
    sections.push(checks.card);
    if (p.hardware && p.hardware !== "cpu") sections.push(launchCard(p));
    const shards = shardsCard(p, base);
    sections.push(shards.card);
    fill(view, sections);
    document.body.dataset.shownMs = String(Math.round(performance.now()));  // for the browser tests
    await layout.ready;
    checks.draw().catch(showProblem);  // after the picture: not on the page's critical path
    shards.start();
  }

  // The layout picture, inlined (an <img> could not follow the picture's links). Its blocks
  // are links to the picture of their own devices (?slice=3); the page follows them in
  // place, keeps the scope in its own address (/plans/{id}?slice=3: bookmarkable, Back
  // works) and shows where it is as a trail of links.
  const SCOPES = ["slice", "host", "process", "positions"];
  function layoutView(id, base) {
    const picture = el("div", { class: "layout", id: "layout-box" }, el("p", { class: "muted", text: "drawing…" }));
    const trail = el("nav", { class: "trail", "aria-label": "picture scope" });
    const hint = el("p", { class: "muted hint", hidden: true });
    const card = el("section", { class: "card", id: "layout-card" }, el("h3", { text: "Layout" }), trail, hint, picture);
    let done;
    const ready = new Promise((resolve) => { done = resolve; });
    const scopeOf = (search) => {
      const q = new URLSearchParams(search);
      return SCOPES.filter((k) => q.get(k)).map((k) => [k, q.get(k)]);
    };
    const drawTrail = (scope) => {
      const steps = [el("a", { href: `/plans/${encodeURIComponent(id)}`, text: "all devices" })];
      scope.forEach(([k, v], i) => {
        const q = new URLSearchParams(scope.slice(0, i + 1));
        const word = v.includes("-") ? { slice: "slices", host: "hosts", process: "processes", positions: "positions" }[k] : k;
        steps.push(" › ", el("a", { href: `?${q}`, text: `${word} ${v.replace("-", "–")}` }));
      });
      fill(trail, scope.length ? steps : null);
    };
    const load = async () => {
      const scope = scopeOf(location.search);
      drawTrail(scope);
      try {
        const q = new URLSearchParams(scope);
        const res = await fetch(`${base}/layout.svg${scope.length ? `?${q}` : ""}`, { headers: token() ? { Authorization: `Bearer ${token()}` } : {} });
        if (!res.ok) {
          let problem = null;
          try { problem = await res.json(); } catch (_) { /* not JSON */ }
          throw new ApiError(res.status, problem);
        }
        const doc = new DOMParser().parseFromString(await res.text(), "image/svg+xml");
        const svg = document.importNode(doc.documentElement, true);
        if (svg.localName !== "svg") throw new Error("the picture is not SVG");
        svg.id = "layout";
        svg.setAttribute("role", "img");
        svg.setAttribute("aria-label", `layout of plan ${id}`);
        fill(picture, svg);
        picture.dataset.drawnMs = String(Math.round(performance.now()));  // for the browser tests
        const blocks = svg.querySelectorAll("a.block").length;
        picture.dataset.blocks = String(blocks);
        const wide = Number(svg.getAttribute("width")) > picture.clientWidth;
        hint.textContent = [blocks ? `${count(blocks, "block")}: open one to see its devices.` : "",
          wide ? "The picture scrolls sideways." : ""].filter(Boolean).join(" ");
        hint.hidden = !hint.textContent;
        picture.dataset.scope = new URLSearchParams(scope).toString();
      } catch (err) {
        fill(picture, el("p", { class: "muted", text: `no picture: ${err.message}` }));
      }
      done();
    };
    const follow = (href) => {
      const url = new URL(href, location.href);
      history.pushState(null, "", `${location.pathname}${url.search}`);
      load();
    };
    card.addEventListener("click", (e) => {
      const a = e.target.closest("a");
      if (!a || !card.contains(a) || e.ctrlKey || e.metaKey || e.shiftKey) return;
      const href = a.getAttribute("href") || a.getAttributeNS("http://www.w3.org/1999/xlink", "href");
      if (!href || !href.startsWith("?") && !href.startsWith("/plans/")) return;
      e.preventDefault();
      follow(href);
    });
    window.addEventListener("popstate", () => load());
    return { card, load, ready };
  }

  function fact(name, value) {
    if (value === undefined || value === null || value === "") return [];
    return [el("dt", { text: name }), el("dd", { text: String(value) })];
  }

  function memoryCard(m) {
    // Every term the total is the sum of (temporaries: gathered FSDP weights, the loss's
    // logits or the recomputed layer, transposed-update copies).
    const parts = ["params", "optimizer", "grads", "activations", "batch", "temporaries"].filter((k) => m[k] !== undefined);
    const rows = parts.map((k) => [k, bytes(m[k])]);
    rows.push([el("b", { text: "total (HBM)" }), el("b", { text: bytes(m.total) })]);
    if (m.vmem) rows.push(["in on-chip VMEM instead (not in the total)", bytes(m.vmem)]);
    if (m.host_offload_bytes) {
      const host = m.host_memory_bytes ? ` of ${bytes(m.host_memory_bytes)} host DRAM per device` : "";
      rows.push(["host offload (activations in host memory, not in the total)", `${bytes(m.host_offload_bytes)}${host}`]);
    }
    const card = el("section", { class: "card", id: "memory" }, el("h3", { text: "Memory per device" }), table(["part", "bytes"], rows));
    if (m.hbm_bytes) {
      const share = m.total / m.hbm_bytes;
      const bar = el("div", { class: `bar ${m.fits === false || share > 1 ? "over" : ""}` });
      bar.style.setProperty("--share", `${Math.min(100, share * 100).toFixed(1)}%`);
      add(card, bar, el("p", { class: m.fits === false ? "bad" : "good", text: `${bytes(m.total)} of ${bytes(m.hbm_bytes)} HBM (${(share * 100).toFixed(1)}%): ${m.fits === false ? "does not fit" : "fits"}` }));
    }
    return card;
  }

  function estimateCard(e) {
    const card = el("section", { class: "card", id: "estimate" }, el("h3", { text: "Step estimate" }),
      el("dl", { class: "facts" }, ...fact("step (predicted)", seconds(e.step_s)), ...fact("roofline", seconds(e.roofline_s)),
        ...fact("the gap", e.gap), ...fact("compute", seconds(e.compute_s)),
        ...fact("communication", seconds(e.comm_s)), ...fact("MFU", e.mfu !== undefined ? `${(e.mfu * 100).toFixed(1)}%` : undefined),
        ...fact("bottleneck", e.bottleneck), ...fact("FLOPs", e.flops !== undefined ? Number(e.flops).toExponential(3) : undefined)));
    if (e.breakdown) {
      const b = e.breakdown;
      add(card, table(["part of the step", "time"], [["matmuls", b.matmul_s], ["flash attention", b.attention_s], ["memory-bound work", b.memory_bound_s],
        ["exposed collectives", b.exposed_comm_s], ["exposed offload transfers", b.offload_s], ["fixed overhead", b.overhead_s]]
        .filter(([, v]) => v !== undefined).map(([k, v]) => [k, seconds(v)]), { class: "breakdown" }));
    }
    if (e.collectives && e.collectives.length) {
      add(card, table(["axis", "collective", "bytes per device", "link", "time"], e.collectives.map((c) => [c.axis, c.kind, bytes(c.bytes_per_device), c.link, seconds(c.seconds)])));
    }
    return card;
  }

  // The plan as a job: MaxText's command line, a GKE JobSet, an sbatch script or the
  // per-process environment (POST /v1/meshes/{id}/launch), to copy or download.
  function launchCard(p) {
    const gpu = /^(h1|h2|b2|gb2)/.test(p.hardware);
    const targets = ["maxtext", "jobset", ...(gpu ? ["slurm"] : []), "env"];
    const target = el("select", { "aria-label": "launch target", id: "launch-target" }, targets.map((t) => el("option", { value: t, text: t })));
    const image = el("input", { type: "text", placeholder: "image (e.g. us-docker.pkg.dev/…/maxtext)", "aria-label": "image" });
    const queue = el("input", { type: "text", placeholder: "Kueue queue (jobset)", "aria-label": "queue" });
    const out = el("pre", { class: "launch", id: "launch-output" });
    let text = "";
    let filename = "launch.txt";
    const copy = el("button", { type: "button", text: "Copy", disabled: true, onclick: () => navigator.clipboard.writeText(text).catch(showProblem) });
    const download = el("button", { type: "button", text: "Download", disabled: true, onclick: () => {
      const link = el("a", { href: URL.createObjectURL(new Blob([text], { type: "text/plain" })), download: filename });
      link.click();
    } });
    const render = (config) => {
      if (config.target === "maxtext") {
        text = `${Object.entries(config.env || {}).map(([k, v]) => `export ${k}=${JSON.stringify(v)}`).join("\n")}\n${config.command.join(" ")}\n`;
        filename = `${p.id}-maxtext.sh`;
      } else if (config.target === "jobset") {
        text = JSON.stringify(config.manifest, null, 2);
        filename = `${p.id}-jobset.json`;
      } else if (config.target === "slurm") {
        text = config.script;
        filename = `${p.id}.sbatch`;
      } else {
        text = JSON.stringify(config, null, 2);
        filename = `${p.id}-env.json`;
      }
      out.textContent = text + (config.notes && config.notes.length ? `\n# ${config.notes.join("\n# ")}` : "");
      copy.disabled = download.disabled = false;
    };
    const start = async (e) => {
      e.preventDefault();
      const body = { target: target.value };
      if (image.value.trim()) body.image = image.value.trim();
      if (queue.value.trim()) body.queue = queue.value.trim();
      try {
        render((await api(`/v1/meshes/${encodeURIComponent(p.id)}/launch`, { method: "POST", body })).data);
        showProblem(null);
      } catch (err) {
        showProblem(err);
      }
    };
    return el("section", { class: "card", id: "launch" }, el("h3", { text: "Launch" }),
      el("form", { class: "launch", onsubmit: start }, target, image, queue, el("button", { type: "submit", text: "Make the launch config" })),
      out, el("div", { class: "actions" }, copy, download));
  }

  function compileCard(p) {
    const list = el("div", { id: "compile-checks" });
    const draft = { model: p.model || { kind: "mlp", features: [16, 64, 4] }, optimizer: "adam" };
    if (p.batch) draft.batch_shape = p.batch.shape;
    const text = el("textarea", { rows: 4, "aria-label": "compile check request", spellcheck: "false" });
    text.value = JSON.stringify(draft);
    const path = `/v1/meshes/${encodeURIComponent(p.id)}/compile-checks`;
    // Returns true while a check is still queued or compiling.
    const draw = async () => {
      if (!(await hasOperation("get", "/v1/meshes/{mesh_id}/compile-checks"))) {
        fill(list, el("p", { class: "muted", text: "this server has no compile checks" }));
        return false;
      }
      const checks = (await api(`${path}?limit=20`)).data.items || [];
      fill(list, checks.length ? table(["check", "status", "fits", "peak", "HBM", "compile", "XLA error"], checks.map((c) => {
        const res = c.result || {};
        const mem = res.memory || {};
        return [c.id, c.status, res.fits === undefined ? "–" : res.fits ? "yes" : "no", bytes(mem.peak_bytes), bytes(mem.hbm_bytes), seconds(res.compile_s), res.xla_error || c.error || ""];
      }), { class: "checks" }) : el("p", { class: "muted", text: "no compile checks yet" }));
      return checks.some((c) => c.status === "queued" || c.status === "compiling");
    };
    const start = async (e) => {
      e.preventDefault();
      try {
        await api(path, { method: "POST", body: JSON.parse(text.value) });
        showProblem(null);
        const poll = async () => { if (await draw()) setTimeout(() => poll().catch(showProblem), 1000); };
        await poll();
      } catch (err) {
        showProblem(err instanceof SyntaxError ? new ApiError(0, { detail: `not JSON: ${err.message}` }) : err);
      }
    };
    const card = el("section", { class: "card" }, el("h3", { text: "Compile checks (XLA's verdict)" }), list,
      el("form", { class: "compile", onsubmit: start }, text, el("button", { type: "submit", text: "Run a compile check" })));
    return { card, draw };
  }

  // The per-device table. Its data is the full plan (~190 bytes a device): plans of up to
  // EAGER_DEVICES devices load it after the page shows; bigger ones when a device is looked
  // for (their picture's blocks open the devices of a slice or host without it).
  const EAGER_DEVICES = 1024;
  function shardsCard(p, base) {
    let shards = null, loading = null;
    const total = Number(p.total_devices) || 0;
    const body = el("div", { id: "shards" });
    const input = el("input", { type: "number", min: "0", placeholder: "device id", "aria-label": "find a device" });
    const note = el("p", { class: "muted" });
    const loadAll = () => {
      if (!loading) {
        note.textContent = `loading the ${count(total, "device")}…`;
        loading = api(base).then((r) => { shards = r.data.shards || []; }, (err) => { loading = null; throw err; });
      }
      return loading;
    };
    const draw = () => {
      if (shards === null) {
        note.textContent = `${count(total, "device")}: find one by id, or open a block of the picture above`;
        return;
      }
      const want = input.value === "" ? null : Number(input.value);
      const rows = (want === null ? shards.slice(0, 32) : shards.filter((s) => s.device === want)).map((s) => [
        String(s.device), String(s.process_index ?? "–"),
        Object.entries(s.coords || {}).map(([k, v]) => `${k}=${v}`).join(" "),
        (s.index || []).map((r) => `[${r[0]}:${r[1]})`).join(" ") || "–",
        String(s.replica ?? "–"), s.physical ? shape(s.physical) : "–",
      ]);
      fill(body, table(["device", "process", "coords", "batch index", "replica", "physical"], rows, { id: "shard-table" },
        want === null ? "none" : `no device ${want} in this plan`));
      note.textContent = want === null && shards.length > 32 ? `first 32 of ${count(shards.length, "device")}; find one by id` : "";
    };
    input.addEventListener("input", () => { loadAll().then(draw).catch(showProblem); });
    const start = () => {
      draw();
      if (total <= EAGER_DEVICES) loadAll().then(draw).catch(showProblem);
    };
    return { card: el("section", { class: "card" }, el("h3", { text: "Devices" }), input, note, body), start };
  }

  // ------------------------------------------------------------------ job page

  // A history answer's rows, whichever shape it has: a plain read answers "points", a
  // downsampled one "buckets" (both may be present, one null or empty); "kind", where the
  // server sends it, says which.
  function historyRows(history) {
    const rows = (k) => (Array.isArray(history[k]) ? history[k] : []);
    if (history.kind === "buckets" || history.kind === "points") return rows(history.kind);
    return rows("points").length ? rows("points") : rows("buckets");
  }
  const downsampled = (history) => history.kind === "buckets" || (history.kind === undefined && Boolean(history.downsampled));

  // Turns a history answer into chart series: {name, steps, min, max, mean, last}.
  // Raw points carry one value per metric; downsampled buckets carry {min, max, mean, last}.
  // Where rows carry a metric's spread over devices, the band is that spread (the devices'
  // min…max) and the series names its straggler (see straggler()).
  function seriesOf(history) {
    const byName = new Map();
    const get = (name) => {
      if (!byName.has(name)) byName.set(name, { name, steps: [], min: [], max: [], mean: [], last: [] });
      return byName.get(name);
    };
    const num = (v) => (v === null || v === undefined ? NaN : Number(v));
    const add = (name, step, v, spread) => {
      if (spread && !Array.isArray(v)) {
        const s = get(name);
        const mean = v && typeof v === "object" ? num(v.mean) : num(v);
        s.steps.push(step); s.min.push(num(spread.min)); s.max.push(num(spread.max));
        s.mean.push(mean); s.last.push(v && typeof v === "object" ? num(v.last ?? v.mean) : mean);
        (s.spread ??= []).push({ step: spread.max_step ?? step, device: spread.max_device, max: num(spread.max), mean });
        return;
      }
      if (Array.isArray(v)) {
        v.slice(0, 8).forEach((x, i) => add(`${name}[${i}]`, step, x));
        return;
      }
      if (v && typeof v === "object" && ("mean" in v || "min" in v)) {
        if (Array.isArray(v.mean)) {
          v.mean.slice(0, 8).forEach((_, i) => add(`${name}[${i}]`, step, { min: v.min?.[i], max: v.max?.[i], mean: v.mean[i], last: v.last?.[i] }));
          return;
        }
        const s = get(name);
        s.steps.push(step); s.min.push(num(v.min ?? v.mean)); s.max.push(num(v.max ?? v.mean));
        s.mean.push(num(v.mean)); s.last.push(num(v.last ?? v.mean));
        return;
      }
      const s = get(name);
      const x = num(v);
      s.steps.push(step); s.min.push(x); s.max.push(x); s.mean.push(x); s.last.push(x);
    };
    for (const p of historyRows(history)) {
      const step = p.step ?? p.last_step ?? p.end_step ?? p.first_step;
      const values = p.reduced ?? p.values ?? p.metrics ?? {};
      const spread = p.spread || {};
      for (const [name, v] of Object.entries(values)) add(name, step, v, spread[name]);
    }
    const series = [...byName.values()];
    for (const s of series) if (s.spread) s.note = straggler(s.spread, downsampled(history) ? "bucket" : "step");
    return series;
  }

  // The straggling device of a series with a spread: the device that held the highest
  // value at the most rows, and the row where the highest value stood furthest above the
  // mean.
  function straggler(rows, unit) {
    const counts = new Map();
    let widest = null;
    for (const r of rows) {
      if (r.device === undefined || r.device === null) continue;
      counts.set(r.device, (counts.get(r.device) || 0) + 1);
      if (isFinite(r.max) && isFinite(r.mean) && (!widest || r.max - r.mean > widest.max - widest.mean)) widest = r;
    }
    if (!counts.size) return "";
    const [device, n] = [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0])[0];
    const far = widest ? `; furthest above the mean at step ${widest.step}: device ${widest.device}, ${fmt(widest.max)} against ${fmt(widest.mean)}` : "";
    return `straggler: device ${device} (highest in ${n} of ${count(rows.length, unit)}${far})`;
  }

  // A linked job's facts: its plan, the predicted and the measured (median) step, the error.
  function fidelityFacts(f) {
    if (!f) return [];
    const seconds = (v) => (typeof v === "number" ? `${fmt(v)} s` : "–");
    const error = typeof f.error === "number" ? `${f.error >= 0 ? "+" : ""}${(100 * f.error).toFixed(1)}%` : "–";
    return [
      el("dt", { text: "plan" }), el("dd", {}, el("a", { href: `/plans/${encodeURIComponent(f.plan)}`, text: f.plan })),
      ...fact("predicted step", seconds(f.predicted_step_s)),
      ...fact(`measured step (median of ${f.points})`, seconds(f.measured_step_s)),
      ...fact("prediction error", error),
    ];
  }

  async function renderJob(job) {
    document.title = `job ${job}`;
    const charts = el("div", { id: "charts" });
    const info = el("p", { class: "muted", id: "job-info" });
    const facts = el("dl", { class: "facts", id: "job-facts" });
    const lag = el("p", { class: "lag", id: "job-lag", role: "status", hidden: true });
    const reset = el("button", { type: "button", text: "Reset zoom", hidden: true });
    fill(view, el("section", { class: "card" }, el("h2", {}, "Job ", el("code", { text: job })), facts, lag, info, reset, charts));
    let range = null, tag = null, fidelity = null;
    const byMetric = new Map();
    // The job's own entry (GET /v1/jobs/{job}): its state, which sources lag, and, linked
    // to a plan, the plan's predicted step time against the measured one (fidelity).
    const loadSummary = async () => {
      if (!(await hasOperation("get", "/v1/jobs/{job}"))) return;
      let j;
      try { j = (await api(`/v1/jobs/${encodeURIComponent(job)}`)).data; } catch (err) { if (err.status === 404) return; throw err; }
      const state = jobState(j);
      fill(facts, ...fact("points", j.points === undefined ? undefined : Number(j.points).toLocaleString("en-US")),
        ...fact("steps", `${j.first_step ?? "–"} … ${j.last_step ?? "–"}`), ...fact("last push", ago(j.last_push_at)),
        el("dt", { text: "state" }), el("dd", {}, el("span", { class: `badge ${state}`, text: state })),
        ...fidelityFacts(j.fidelity));
      fidelity = j.fidelity || null;
      const text = lagText(j);
      lag.hidden = !text;
      lag.classList.toggle("lagging", state === "lagging");
      lag.textContent = text
        ? `${state === "lagging" ? "Lagging" : "Arriving"}: step ${j.incomplete_step} is waiting for ${text.replace(/ \(step \d+\)$/, "")}` +
          ` (${count(j.missing_count, "source")} missing). The charts show complete steps only` +
          (j.last_step !== null && j.last_step !== undefined ? `, up to step ${j.last_step}.` : ".")
        : "";
    };
    const load = async (force) => {
      await loadSummary().catch(showProblem); // before the charts: the prediction's line
      const width = Math.max(200, charts.clientWidth || 800);
      const q = new URLSearchParams({ max_points: String(Math.min(2000, Math.round(width))) });
      if (range) { q.set("since_step", String(range[0])); q.set("until_step", String(range[1])); }
      const r = await api(`/v1/jobs/${encodeURIComponent(job)}/metrics?${q}`, { etag: force ? null : tag });
      if (r.status === 304) return;
      tag = r.etag;
      const series = seriesOf(r.data);
      const points = series.length ? series[0].steps.length : 0;
      info.textContent = series.length
        ? `${count(series.length, "metric")}; ${count(points, downsampled(r.data) ? "bucket" : "point")}${downsampled(r.data) ? " (downsampled" : ""}` +
          `${series.some((s) => s.spread) ? `${downsampled(r.data) ? "; " : " ("}band = devices' min…max, line = mean)` : downsampled(r.data) ? ": band = min…max, line = mean)" : ""}` +
          (range ? `; steps ${range[0]}–${range[1]}` : "") + ". Drag over a chart to zoom, double-click to reset."
        : "no points yet";
      // one chart per metric (a vector metric's components share it)
      const groups = new Map();
      for (const s of series) {
        const base = s.name.replace(/\[\d+\]$/, "");
        if (!groups.has(base)) groups.set(base, []);
        groups.get(base).push(s);
      }
      charts.dataset.metrics = [...groups.keys()].join(",");
      for (const [name, group] of groups) {
        let chart = byMetric.get(name);
        if (!chart) {
          const box = el("figure", { class: "metric", "data-metric": name }, el("figcaption", { text: name }));
          add(charts, box);
          chart = new Chart(box, { title: `${name} over steps`, onZoom: (z) => { range = z; reset.hidden = !z; load(true).catch(showProblem); } });
          byMetric.set(name, chart);
        }
        chart.setData(withPrediction(name, group));
      }
    };
    // The step-time metric's chart gets the plan's prediction as a flat line beside it.
    const withPrediction = (name, group) => {
      const f = fidelity;
      if (!f || f.step_time_metric !== name || typeof f.predicted_step_s !== "number" || !group.length) return group;
      const steps = group[0].steps;
      return [...group, { name: "predicted (plan)", steps, mean: steps.map(() => f.predicted_step_s) }];
    };
    reset.addEventListener("click", () => { range = null; reset.hidden = true; load(true).catch(showProblem); });
    await load(true);
    every(POLL_MS, () => load(false));
    window.addEventListener("resize", () => byMetric.forEach((c) => c.draw()));
  }

  // ------------------------------------------------------------------ session page

  async function renderSession(id) {
    document.title = `session ${id}`;
    const facts = el("dl", { class: "facts", id: "session-facts" });
    const params = el("div");
    const chartBox = el("figure", { class: "metric", "data-metric": "loss" }, el("figcaption", { text: "loss" }));
    const note = el("p", { class: "muted", id: "loss-note" });
    const steps = el("input", { type: "number", min: "1", value: "10", "aria-label": "steps to run" });
    const batch = el("input", { type: "number", min: "1", value: "32", "aria-label": "synthetic batch size" });
    const run = el("form", { class: "run" }, "Run ", steps, " steps on a synthetic batch of ", batch, " ", el("button", { type: "submit", text: "Run" }));
    fill(view, el("section", { class: "card" }, el("h2", {}, "Session ", el("code", { text: id })), facts, run),
      el("section", { class: "card" }, el("h3", { text: "Loss" }), chartBox, note),
      el("section", { class: "card" }, el("h3", { text: "Parameter layouts" }), params));
    const chart = new Chart(chartBox, { title: "loss over steps" });
    // The service's loss history: [[step, loss], ...], every stride-th step, at most 2,000
    // points; the last step joins it when the stride skipped it.
    const drawChart = (s) => {
      const pts = (s.loss_history || []).slice();
      if (s.step > 0 && (!pts.length || pts[pts.length - 1][0] < s.step)) pts.push([s.step, s.last_loss]);
      chart.setData([{ name: "loss", steps: pts.map((p) => p[0]), mean: pts.map((p) => p[1]) }]);
      const stride = s.loss_history_stride || 1;
      note.textContent = pts.length
        ? `${count(pts.length, "point")}: ${stride > 1 ? `every ${stride}th step of ${s.step}` : `every step`}, kept by the service (at most 2,000). Drag over the chart to zoom, double-click to reset.`
        : "no steps yet";
    };
    let tag = null;
    const load = async () => {
      const r = await api(`/v1/sessions/${encodeURIComponent(id)}`, { etag: tag });
      if (r.status === 304) return;
      tag = r.etag;
      const s = r.data;
      fill(facts, ...fact("step", s.step), ...fact("last loss", fmt(s.last_loss)),
        ...(s.mesh_id ? [el("dt", { text: "plan" }), el("dd", {}, el("a", { href: `/plans/${encodeURIComponent(s.mesh_id)}`, text: s.mesh_id }))] : []),
        ...fact("strategy", s.strategy), ...fact("param sharding", s.param_sharding));
      fill(params, table(["path", "shape", "spec", "shard shape", "bytes per device"], (s.params || []).map((q) => [q.path, shape(q.shape), spec(q.spec), shape(q.shard_shape), bytes(q.bytes_per_device)])));
      drawChart(s);
    };
    run.addEventListener("submit", async (e) => {
      e.preventDefault();
      try {
        await api(`/v1/sessions/${encodeURIComponent(id)}/steps`, {
          method: "POST", body: { steps: Number(steps.value), synthetic: { seed: 0, batch_size: Number(batch.value) } },
        });
        showProblem(null);
        tag = null;
        await load();
      } catch (err) { showProblem(err); }
    });
    await load();
    every(POLL_MS, load);
    window.addEventListener("resize", () => chart.draw());
  }

  // ------------------------------------------------------------------ devices page

  async function renderDevices() {
    document.title = "devices";
    const health = el("div", { id: "health" });
    const devices = el("div", { id: "devices" });
    fill(view, el("section", { class: "card" }, el("h2", { text: "Health" }), health),
      el("section", { class: "card" }, el("h2", { text: "Devices" }), devices));
    const load = async () => {
      const live = await api("/health/live").then(() => "ok", (e) => e.message);
      let ready;
      try { const r = await api("/health/ready"); ready = { ok: true, text: `ready (runtime pid ${r.data.runtime_pid}, ${count(r.data.runtime_restarts, "restart")})` }; } catch (e) { ready = { ok: false, text: `not ready: ${e.message}` }; }
      fill(health, el("dl", { class: "facts" },
        el("dt", { text: "liveness" }), el("dd", { class: live === "ok" ? "good" : "bad", text: live }),
        el("dt", { text: "readiness" }), el("dd", { class: ready.ok ? "good" : "bad", text: ready.text })));
      let d;
      try { d = (await api("/v1/devices")).data; } catch (e) { fill(devices, el("p", { class: "bad", text: e.message })); return; }
      const budget = d.memory_budget || {};
      fill(devices, el("dl", { class: "facts" },
        ...fact("platform", d.platform), ...fact("processes", `${d.process_count} (this is ${d.process_index})`),
        ...fact("devices", d.devices.length), ...fact("memory budget (host)", budget.host !== undefined ? bytes(budget.host) : undefined),
        ...fact("memory budget (per device)", budget.device !== undefined && budget.device !== null ? bytes(budget.device) : undefined)),
        table(["id", "kind", "platform", "process", "coords"], d.devices.map((x) => [String(x.id), x.kind, x.platform || "–", String(x.process_index), x.coords ? shape(x.coords) : "–"]), { id: "device-table" }));
    };
    await load();
    every(POLL_MS, load);
  }

  // ------------------------------------------------------------------ router

  async function route() {
    setupLogin();
    const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
    try {
      if (parts.length === 0) await renderHome();
      else if (parts[0] === "plans" && parts.length === 2) await renderPlan(parts[1]);
      else if (parts[0] === "jobs" && parts.length === 2) await renderJob(parts[1]);
      else if (parts[0] === "sessions" && parts.length === 2) await renderSession(parts[1]);
      else if (parts[0] === "devices") await renderDevices();
      else fill(view, el("p", { text: "No such page." }));
      document.body.dataset.ready = "true";
    } catch (err) {
      showProblem(err);
      fill(view, el("p", { class: "bad", text: `Could not load this page: ${err.message}` }));
      document.body.dataset.ready = "error";
    }
  }

  // The pure parts, for the browser tests (tests/e2e/test_dashboard.py) and the console.
  window.DataraxDashboard = Object.freeze({ seriesOf, historyRows, downsampled, count, rate, jobState, lagText });

  route();
})();
