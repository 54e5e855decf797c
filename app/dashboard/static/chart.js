// A small canvas chart for metric histories: per series a min-max band and a mean line,
// zoomable by dragging over a range of steps (double-click resets). It draws what it is
// given; the server downsamples (max_points), so a 1,000,000-step job arrives as at most
// a few thousand buckets and a redraw costs a few milliseconds.
"use strict";

const DataraxChart = (() => {
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

  function niceTicks(lo, hi, count) {
    if (!isFinite(lo) || !isFinite(hi)) return [];
    if (lo === hi) return [lo];
    const span = hi - lo;
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
    return ticks;
  }

  function fmt(v) {
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
    return Number(v.toPrecision(4)).toString();
  }

  // series: [{name, steps: [], min: [], max: [], mean: []}]
  class Chart {
    constructor(container, { title, height = 220, onZoom } = {}) {
      this.container = container;
      this.height = height;
      this.onZoom = onZoom;
      this.series = [];
      this.canvas = document.createElement("canvas");
      this.canvas.className = "chart";
      this.canvas.setAttribute("role", "img");
      this.canvas.setAttribute("aria-label", title || "chart");
      this.caption = document.createElement("div");
      this.caption.className = "chart-caption";
      container.append(this.canvas, this.caption);
      this.pad = { left: 56, right: 12, top: 10, bottom: 24 };
      this.drag = null;
      this.canvas.addEventListener("mousedown", (e) => this.startDrag(e));
      window.addEventListener("mousemove", (e) => this.moveDrag(e));
      window.addEventListener("mouseup", (e) => this.endDrag(e));
      this.canvas.addEventListener("dblclick", () => this.onZoom && this.onZoom(null));
      this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    }

    setData(series) {
      this.series = series;
      this.canvas.dataset.series = String(series.length);
      this.canvas.dataset.points = String(series.reduce((n, s) => n + s.steps.length, 0));
      this.draw();
    }

    domain() {
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of this.series) {
        for (let i = 0; i < s.steps.length; i++) {
          const x = s.steps[i];
          if (x < x0) x0 = x;
          if (x > x1) x1 = x;
          const lo = s.min[i], hi = s.max[i];
          if (isFinite(lo) && lo < y0) y0 = lo;
          if (isFinite(hi) && hi > y1) y1 = hi;
        }
      }
      if (x0 === x1) { x0 -= 1; x1 += 1; }
      if (!isFinite(y0)) { y0 = 0; y1 = 1; }
      if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
      const margin = (y1 - y0) * 0.05;
      return { x0, x1, y0: y0 - margin, y1: y1 + margin };
    }

    draw() {
      const dpr = window.devicePixelRatio || 1;
      const width = Math.max(200, this.container.clientWidth || 600);
      const c = this.canvas;
      c.style.width = width + "px";
      c.style.height = this.height + "px";
      c.width = Math.round(width * dpr);
      c.height = Math.round(this.height * dpr);
      const g = c.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, width, this.height);
      const { left, right, top, bottom } = this.pad;
      const w = width - left - right, h = this.height - top - bottom;
      const d = (this.d = this.domain());
      this.w = w;
      const sx = (x) => left + ((x - d.x0) / (d.x1 - d.x0)) * w;
      const sy = (y) => top + (1 - (y - d.y0) / (d.y1 - d.y0)) * h;
      this.sx = sx;
      g.font = "11px system-ui, sans-serif";
      g.strokeStyle = "#e5e7eb";
      g.fillStyle = "#6b7280";
      g.lineWidth = 1;
      for (const t of niceTicks(d.y0, d.y1, 4)) {
        const y = Math.round(sy(t)) + 0.5;
        g.beginPath(); g.moveTo(left, y); g.lineTo(left + w, y); g.stroke();
        g.textAlign = "right"; g.textBaseline = "middle";
        g.fillText(fmt(t), left - 6, y);
      }
      for (const t of niceTicks(d.x0, d.x1, Math.max(2, Math.floor(w / 90)))) {
        const x = Math.round(sx(t)) + 0.5;
        g.beginPath(); g.moveTo(x, top); g.lineTo(x, top + h); g.stroke();
        g.textAlign = "center"; g.textBaseline = "top";
        g.fillText(fmt(t), x, top + h + 6);
      }
      g.save();
      g.beginPath(); g.rect(left, top, w, h); g.clip();
      this.series.forEach((s, k) => {
        const color = COLORS[k % COLORS.length];
        const n = s.steps.length;
        if (!n) return;
        // min-max band: along max forwards, back along min
        g.beginPath();
        let open = false;
        for (let i = 0; i < n; i++) {
          if (!isFinite(s.max[i])) continue;
          const x = sx(s.steps[i]), y = sy(s.max[i]);
          if (open) g.lineTo(x, y); else { g.moveTo(x, y); open = true; }
        }
        for (let i = n - 1; i >= 0; i--) {
          if (!isFinite(s.min[i])) continue;
          g.lineTo(sx(s.steps[i]), sy(s.min[i]));
        }
        g.closePath();
        g.globalAlpha = 0.18; g.fillStyle = color; g.fill(); g.globalAlpha = 1;
        // mean line
        g.beginPath();
        open = false;
        for (let i = 0; i < n; i++) {
          const v = s.mean[i];
          if (!isFinite(v)) { open = false; continue; }
          const x = sx(s.steps[i]), y = sy(v);
          if (open) g.lineTo(x, y); else { g.moveTo(x, y); open = true; }
        }
        g.strokeStyle = color; g.lineWidth = 1.5; g.stroke();
        if (n === 1 && isFinite(s.mean[0])) {
          g.fillStyle = color; g.beginPath(); g.arc(sx(s.steps[0]), sy(s.mean[0]), 3, 0, 7); g.fill();
        }
      });
      g.restore();
      if (this.drag && this.drag.x1 !== undefined) {
        const a = Math.min(this.drag.x0, this.drag.x1), b = Math.max(this.drag.x0, this.drag.x1);
        g.fillStyle = "rgba(37, 99, 235, 0.12)";
        g.fillRect(a, top, b - a, h);
      }
      this.caption.replaceChildren(
        ...this.series.map((s, k) => {
          const item = document.createElement("span");
          item.className = "legend";
          item.style.setProperty("--c", COLORS[k % COLORS.length]);
          const last = s.last && s.last.length ? s.last[s.last.length - 1] : s.mean[s.mean.length - 1];
          item.textContent = `${s.name}: ${fmt(last)}`;
          return item;
        })
      );
    }

    localX(e) {
      return e.clientX - this.canvas.getBoundingClientRect().left;
    }

    startDrag(e) {
      if (!this.d) return;
      this.drag = { x0: this.localX(e) };
      e.preventDefault();
    }

    moveDrag(e) {
      if (!this.drag) return;
      this.drag.x1 = this.localX(e);
      this.draw();
    }

    endDrag(e) {
      if (!this.drag) return;
      const drag = this.drag;
      this.drag = null;
      const x1 = this.localX(e);
      this.draw();
      if (Math.abs(x1 - drag.x0) < 5 || !this.onZoom) return;
      const toStep = (x) => this.d.x0 + ((x - this.pad.left) / this.w) * (this.d.x1 - this.d.x0);
      const a = Math.max(this.d.x0, toStep(Math.min(drag.x0, x1)));
      const b = Math.min(this.d.x1, toStep(Math.max(drag.x0, x1)));
      this.onZoom([Math.floor(a), Math.ceil(b)]);
    }

    hover(e) {
      if (!this.d || this.drag || !this.series.length) return;
      const x = this.localX(e);
      const step = this.d.x0 + ((x - this.pad.left) / this.w) * (this.d.x1 - this.d.x0);
      const s = this.series[0];
      let best = 0;
      for (let i = 1; i < s.steps.length; i++) {
        if (Math.abs(s.steps[i] - step) < Math.abs(s.steps[best] - step)) best = i;
      }
      const parts = this.series.map((t) => {
        const i = Math.min(best, t.steps.length - 1);
        return `${t.name} mean ${fmt(t.mean[i])} [${fmt(t.min[i])}, ${fmt(t.max[i])}]`;
      });
      this.canvas.title = `step ${s.steps[best]}: ${parts.join("; ")}`;
    }
  }

  return { Chart, fmt };
})();
