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
    if (err.status === 401) text = "This needs the API token: enter it above and sign in. (" + text + ")";
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
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function table(columns, rows, attrs = {}) {
    return el("table", attrs,
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", { text: c })))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((v) => el("td", {}, v))))));
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
  let operations = null;
  async function hasOperation(method, path) {
    if (!operations) operations = api("/openapi.json").then((r) => r.data.paths || {});
    const ops = await operations;
    return Boolean(ops[path] && ops[path][method]);
  }

  const pollers = [];
  function every(ms, fn) {
    const id = setInterval(() => { if (!document.hidden) fn().catch(showProblem); }, ms);
    pollers.push(id);
  }

  // ------------------------------------------------------------------ login

  function setupLogin() {
    const form = document.getElementById("login");
    const input = document.getElementById("token");
    const out = document.getElementById("sign-out");
    const state = document.getElementById("login-state");
    const render = () => {
      const on = Boolean(token());
      out.hidden = !on;
      input.hidden = on;
      document.getElementById("sign-in").hidden = on;
      state.textContent = on ? "signed in" : "";
    };
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
      input.value = "";
      render();
      showProblem(null);
    });
    out.addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); render(); });
    render();
  }

  // ------------------------------------------------------------------ home

  async function renderHome() {
    document.title = "datarax dashboard";
    const plansBody = el("div", { id: "plans-list" });
    const search = el("input", { id: "plan-search", type: "search", placeholder: "search name, id, platform, axes" });
    const jobsBody = el("div", { id: "jobs-list" });
    const sessionsBody = el("div", { id: "sessions-list" });
    view.replaceChildren(
      el("section", { id: "plans", class: "card" }, el("h2", { text: "Plans" }), search, plansBody),
      el("section", { id: "jobs", class: "card" }, el("h2", { text: "Jobs" }), jobsBody),
      el("section", { id: "sessions", class: "card" }, el("h2", { text: "Sessions" }), sessionsBody),
    );

    let plans = [], total = 0, plansTag = null;
    const drawPlans = () => {
      const q = search.value.trim().toLowerCase();
      const shown = plans.filter((p) => !q || [p.name, p.id, p.platform, p.hardware, Object.keys(p.axes || {}).join(" "), p.live ? "live" : "abstract"]
        .some((f) => f && String(f).toLowerCase().includes(q)));
      plansBody.replaceChildren(
        el("p", { class: "muted", text: `${total} plans, newest first${q ? `; ${shown.length} of the ${plans.length} loaded match` : ""}` }),
        table(["name", "id", "kind", "devices", "axes", "created"], shown.map((p) => [
          p.name || "–",
          el("a", { href: `/plans/${encodeURIComponent(p.id)}`, text: p.id }),
          el("span", { class: p.live ? "badge live" : "badge", text: p.live ? "live" : "abstract" }),
          String(p.total_devices),
          Object.entries(p.axes || {}).map(([k, v]) => `${k}=${v}`).join(" × "),
          ago(p.created_at),
        ]), { class: "plans" }),
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
        if (!jobsBody.firstChild) jobsBody.replaceChildren(openBox("job", "/jobs/", "this server does not list jobs; open one by name"));
        return;
      }
      const r = await api("/v1/jobs", { etag: jobsTag });
      if (r.status === 304) return;
      jobsTag = r.etag;
      const items = r.data.items || [];
      jobsBody.replaceChildren(
        el("p", { class: "muted", text: `${r.data.total ?? items.length} jobs` }),
        table(["job", "points", "steps", "last push", "state"], items.map((j) => {
          const idle = j.last_push_at ? (Date.now() - Date.parse(j.last_push_at)) / 1000 : Infinity;
          const state = j.finished ? "finished" : idle > 300 ? "stale" : "active";
          return [
            el("a", { href: `/jobs/${encodeURIComponent(j.job)}`, text: j.job }),
            String(j.points ?? "–"),
            `${j.first_step ?? "–"} … ${j.last_step ?? "–"}`,
            ago(j.last_push_at),
            el("span", { class: `badge ${state}`, text: state }),
          ];
        }), { class: "jobs" }),
        openBox("job", "/jobs/", "open a job by name"),
      );
    };

    let sessionsTag = null;
    const loadSessions = async () => {
      if (!(await hasOperation("get", "/v1/sessions"))) {
        if (!sessionsBody.firstChild) sessionsBody.replaceChildren(openBox("session", "/sessions/", "this server does not list sessions; open one by id"));
        return;
      }
      const r = await api("/v1/sessions", { etag: sessionsTag });
      if (r.status === 304) return;
      sessionsTag = r.etag;
      const items = r.data.items || [];
      sessionsBody.replaceChildren(
        table(["session", "plan", "step", "last loss"], items.map((s) => [
          el("a", { href: `/sessions/${encodeURIComponent(s.id)}`, text: s.id }),
          s.mesh_id ? el("a", { href: `/plans/${encodeURIComponent(s.mesh_id)}`, text: s.mesh_id }) : "–",
          String(s.step ?? "–"),
          fmt(s.last_loss ?? NaN),
        ]), { class: "sessions" }),
        openBox("session", "/sessions/", "open a session by id"),
      );
    };

    const all = () => Promise.all([loadPlans(), loadJobs(), loadSessions()]);
    await all();
    if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
    every(POLL_MS * 2, all);
  }

  function openBox(what, prefix, label) {
    const input = el("input", { type: "text", placeholder: `${what} ${what === "job" ? "name" : "id"}`, "aria-label": label });
    return el("form", { class: "open", onsubmit: (e) => { e.preventDefault(); if (input.value) location.href = prefix + encodeURIComponent(input.value.trim()); } },
      el("span", { class: "muted", text: label + ": " }), input, el("button", { type: "submit", text: "Open" }));
  }

  // ------------------------------------------------------------------ plan page

  async function renderPlan(id) {
    document.title = `plan ${id}`;
    // The picture is drawn by the server while the plan travels: ask for both at once.
    const svgAnswer = api(`/v1/meshes/${encodeURIComponent(id)}/layout.svg`, { raw: true });
    svgAnswer.catch(() => {});
    const r = await api(`/v1/meshes/${encodeURIComponent(id)}`);
    const p = r.data;
    document.title = `plan ${p.name || p.id}`;
    const axesRows = p.axes_detail
      ? p.axes_detail.map((a) => [a.name, String(a.size), String(a.ici ?? "–"), String(a.dcn ?? "–"),
        el("span", { class: `badge link-${a.link}`, text: a.link }), a.bytes_per_s ? `${bytes(a.bytes_per_s)}/s` : "–"])
      : Object.entries(p.axes).map(([k, v]) => [k, String(v), "–", "–", "–", "–"]);
    const picture = el("div", { class: "layout" }, el("p", { class: "muted", text: "drawing…" }));
    const sections = [
      el("section", { class: "card" },
        el("h2", {}, p.name || p.id, " ", el("span", { class: p.live ? "badge live" : "badge", text: p.live ? "live" : "abstract" })),
        el("dl", { class: "facts" },
          ...fact("id", p.id), ...fact("platform", p.platform), ...fact("hardware", p.hardware),
          ...fact("devices", p.total_devices), ...fact("created", p.created_at),
          ...(p.batch ? [...fact("batch", `${shape(p.batch.shape)} spec ${spec(p.batch.spec)} shard ${shape(p.batch.shard_shape)}`)] : [])),
        el("h3", { text: "Axes" }),
        table(["axis", "size", "ici", "dcn", "link", "bandwidth"], axesRows, { id: "axes" })),
      el("section", { class: "card" }, el("h3", { text: "Layout" }), picture),
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
    sections.push(shardsCard(p));
    view.replaceChildren(...sections);
    try {
      const svg = await svgAnswer;
      const img = el("img", { id: "layout", alt: `layout of plan ${p.id}`, src: URL.createObjectURL(svg.data) });
      picture.replaceChildren(img);
    } catch (err) {
      picture.replaceChildren(el("p", { class: "muted", text: `no picture: ${err.message}` }));
    }
    checks.draw().catch(showProblem);  // after the picture: not on the page's critical path
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
      card.append(bar, el("p", { class: m.fits === false ? "bad" : "good", text: `${bytes(m.total)} of ${bytes(m.hbm_bytes)} HBM (${(share * 100).toFixed(1)}%): ${m.fits === false ? "does not fit" : "fits"}` }));
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
      card.append(table(["part of the step", "time"], [["matmuls", b.matmul_s], ["flash attention", b.attention_s], ["memory-bound work", b.memory_bound_s],
        ["exposed collectives", b.exposed_comm_s], ["exposed offload transfers", b.offload_s], ["fixed overhead", b.overhead_s]]
        .filter(([, v]) => v !== undefined).map(([k, v]) => [k, seconds(v)]), { class: "breakdown" }));
    }
    if (e.collectives && e.collectives.length) {
      card.append(table(["axis", "collective", "bytes per device", "link", "time"], e.collectives.map((c) => [c.axis, c.kind, bytes(c.bytes_per_device), c.link, seconds(c.seconds)])));
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
        list.replaceChildren(el("p", { class: "muted", text: "this server has no compile checks" }));
        return false;
      }
      const checks = (await api(`${path}?limit=20`)).data.items || [];
      list.replaceChildren(checks.length ? table(["check", "status", "fits", "peak", "HBM", "compile", "XLA error"], checks.map((c) => {
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

  function shardsCard(p) {
    const shards = p.shards || [];
    const body = el("div");
    const input = el("input", { type: "number", min: "0", placeholder: "device id", "aria-label": "find a device" });
    const draw = () => {
      const want = input.value === "" ? null : Number(input.value);
      const rows = (want === null ? shards.slice(0, 32) : shards.filter((s) => s.device === want)).map((s) => [
        String(s.device), String(s.process_index ?? "–"),
        Object.entries(s.coords || {}).map(([k, v]) => `${k}=${v}`).join(" "),
        (s.index || []).map((r) => `[${r[0]}:${r[1]})`).join(" ") || "–",
        String(s.replica ?? "–"), s.physical ? shape(s.physical) : "–",
      ]);
      body.replaceChildren(table(["device", "process", "coords", "batch index", "replica", "physical"], rows),
        want === null && shards.length > 32 ? el("p", { class: "muted", text: `first 32 of ${shards.length} devices; find one by id` }) : null);
    };
    input.addEventListener("input", draw);
    draw();
    return el("section", { class: "card" }, el("h3", { text: "Shards" }), input, body);
  }

  // ------------------------------------------------------------------ job page

  // Turns a history answer into chart series: {name, steps, min, max, mean, last}.
  // Raw points carry one value per metric; downsampled buckets carry {min, max, mean, last}.
  function seriesOf(history) {
    const byName = new Map();
    const get = (name) => {
      if (!byName.has(name)) byName.set(name, { name, steps: [], min: [], max: [], mean: [], last: [] });
      return byName.get(name);
    };
    const num = (v) => (v === null || v === undefined ? NaN : Number(v));
    const add = (name, step, v) => {
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
    for (const p of history.points || history.buckets || []) {
      const step = p.step ?? p.last_step ?? p.end_step ?? p.first_step;
      const values = p.reduced ?? p.values ?? p.metrics ?? {};
      for (const [name, v] of Object.entries(values)) add(name, step, v);
    }
    return [...byName.values()];
  }

  async function renderJob(job) {
    document.title = `job ${job}`;
    const charts = el("div", { id: "charts" });
    const info = el("p", { class: "muted" });
    const reset = el("button", { type: "button", text: "Reset zoom", hidden: true });
    view.replaceChildren(el("section", { class: "card" }, el("h2", {}, "Job ", el("code", { text: job })), info, reset, charts));
    let range = null, tag = null;
    const byMetric = new Map();
    const load = async (force) => {
      const width = Math.max(200, charts.clientWidth || 800);
      const q = new URLSearchParams({ max_points: String(Math.min(2000, Math.round(width))) });
      if (range) { q.set("since_step", String(range[0])); q.set("until_step", String(range[1])); }
      const r = await api(`/v1/jobs/${encodeURIComponent(job)}/metrics?${q}`, { etag: force ? null : tag });
      if (r.status === 304) return;
      tag = r.etag;
      const series = seriesOf(r.data);
      const points = series.length ? series[0].steps.length : 0;
      info.textContent = series.length
        ? `${series.length} metrics; ${points} ${r.data.downsampled ? "buckets (downsampled: band = min…max, line = mean)" : "points"}` +
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
          charts.append(box);
          chart = new Chart(box, { title: `${name} over steps`, onZoom: (z) => { range = z; reset.hidden = !z; load(true).catch(showProblem); } });
          byMetric.set(name, chart);
        }
        chart.setData(group);
      }
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
    view.replaceChildren(el("section", { class: "card" }, el("h2", {}, "Session ", el("code", { text: id })), facts, run),
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
        ? `${pts.length} points: ${stride > 1 ? `every ${stride}th step of ${s.step}` : `every step`}, kept by the service (at most 2,000). Drag over the chart to zoom, double-click to reset.`
        : "no steps yet";
    };
    let tag = null;
    const load = async () => {
      const r = await api(`/v1/sessions/${encodeURIComponent(id)}`, { etag: tag });
      if (r.status === 304) return;
      tag = r.etag;
      const s = r.data;
      facts.replaceChildren(...fact("step", s.step), ...fact("last loss", fmt(s.last_loss ?? NaN)),
        ...fact("plan", s.mesh_id), ...fact("strategy", s.strategy), ...fact("param sharding", s.param_sharding));
      if (s.mesh_id) facts.querySelectorAll("dd")[2].replaceChildren(el("a", { href: `/plans/${encodeURIComponent(s.mesh_id)}`, text: s.mesh_id }));
      params.replaceChildren(table(["path", "shape", "spec", "shard shape", "bytes per device"], (s.params || []).map((q) => [q.path, shape(q.shape), spec(q.spec), shape(q.shard_shape), bytes(q.bytes_per_device)])));
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
    view.replaceChildren(el("section", { class: "card" }, el("h2", { text: "Health" }), health),
      el("section", { class: "card" }, el("h2", { text: "Devices" }), devices));
    const load = async () => {
      const live = await api("/health/live").then(() => "ok", (e) => e.message);
      let ready;
      try { const r = await api("/health/ready"); ready = { ok: true, text: `ready (runtime pid ${r.data.runtime_pid}, ${r.data.runtime_restarts} restarts)` }; } catch (e) { ready = { ok: false, text: `not ready: ${e.message}` }; }
      health.replaceChildren(el("dl", { class: "facts" },
        el("dt", { text: "liveness" }), el("dd", { class: live === "ok" ? "good" : "bad", text: live }),
        el("dt", { text: "readiness" }), el("dd", { class: ready.ok ? "good" : "bad", text: ready.text })));
      let d;
      try { d = (await api("/v1/devices")).data; } catch (e) { devices.replaceChildren(el("p", { class: "bad", text: e.message })); return; }
      const budget = d.memory_budget || {};
      devices.replaceChildren(el("dl", { class: "facts" },
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
      else view.replaceChildren(el("p", { text: "No such page." }));
      document.body.dataset.ready = "true";
    } catch (err) {
      showProblem(err);
      view.replaceChildren(el("p", { class: "bad", text: `Could not load this page: ${err.message}` }));
      document.body.dataset.ready = "error";
    }
  }

  route();
})();
