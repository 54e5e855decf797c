// Charts of metric histories, drawn by uPlot (vendored: /dashboard/vendor/uplot-1.6.32/).
// Per series a min-max band and a mean line (or a line alone; a series with a note, such
// as the straggling device of a spread over devices, says it under the chart); drag over a range of steps
// to zoom (a chart given onZoom hands the range to the page, which asks the server for that
// range; one without zooms in place), double-click to reset. It draws what it is given; the
// server downsamples (max_points), so a 1,000,000-step job arrives as at most a few
// thousand buckets.
"use strict";

const DataraxChart = (() => {
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
    return Number(v.toPrecision(4)).toString();
  }

  // Axis tick labels: as short as the value allows ("0.0001" is "1e-4", "0.00025" is
  // "2.5e-4", 1234567 is "1.23e6"); fmt() keeps 3 decimals for legends and captions.
  function tick(v) {
    if (v === null || v === undefined || !isFinite(v)) return "";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) {
      const [m, e] = v.toExponential(2).split("e");
      return `${Number(m)}e${Number(e)}`;
    }
    return String(Number(v.toPrecision(4)));
  }

  // The y axis is as wide as its longest label (measured in the axis' own font), so no
  // label is cut at the chart's left edge, whatever the metric's scale.
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1 && axis._size) return axis._size;
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    let px = 0;
    if (longest) {
      u.ctx.save();
      u.ctx.font = Array.isArray(axis.font) ? axis.font[0] : axis.font || "12px system-ui";
      px = u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
      u.ctx.restore();
    }
    const ticks = axis.ticks && axis.ticks.show !== false ? axis.ticks.size || 10 : 0;
    return Math.ceil(px + ticks + (axis.gap ?? 5) + 8);
  }

  // Steps are whole numbers: the x axis ticks every 1, 2, 5, 10, 20, 50, ... steps.
  const STEP_INCRS = Array.from({ length: 12 }, (_, e) => [1, 2, 5].map((m) => m * 10 ** e)).flat();

  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
  }

  const gap = (v) => (v === null || v === undefined || !isFinite(v) ? null : Number(v));

  // series: [{name, steps: [], mean: [], min?: [], max?: [], last?: []}]; without min/max a
  // series is a line alone. Returns uPlot's columns: steps, then per series (max, min,) mean.
  function columns(series) {
    const sameSteps = series.every((s) => s.steps === series[0].steps ||
      (s.steps.length === series[0].steps.length && s.steps.every((x, i) => x === series[0].steps[i])));
    const xs = sameSteps && series.length ? series[0].steps.slice()
      : [...new Set(series.flatMap((s) => s.steps))].sort((a, b) => a - b);
    const cols = [xs];
    for (const s of series) {
      const at = sameSteps ? null : new Map(s.steps.map((x, i) => [x, i]));
      const pick = (arr) => xs.map((x, i) => {
        const j = at ? at.get(x) : i;
        return j === undefined ? null : gap(arr[j]);
      });
      if (s.min && s.max) cols.push(pick(s.max), pick(s.min));
      cols.push(pick(s.mean));
    }
    return cols;
  }

  class Chart {
    constructor(container, { title, height = 220, onZoom } = {}) {
      this.container = container;
      this.height = height;
      this.onZoom = onZoom;
      this.series = [];
      this.plot = null;
      this.shape = "";
      this.box = document.createElement("div");
      this.box.className = "chart";
      this.box.setAttribute("role", "img");
      this.box.setAttribute("aria-label", title || "chart");
      this.caption = document.createElement("div");
      this.caption.className = "chart-caption";
      container.append(this.box, this.caption);
    }

    width() {
      return Math.max(200, this.container.clientWidth || 600);
    }

    options() {
      // The legend shows the values under the cursor, or nothing (never a dash) where the
      // cursor is off the chart or the step holds no value.
      const blank = (v) => v === null || v === undefined;
      const series = [{ label: "step", value: (u, v) => (blank(v) ? "" : String(v)) }];
      const bands = [];
      this.series.forEach((s, k) => {
        const color = COLORS[k % COLORS.length];
        const value = (u, v) => (blank(v) ? "" : fmt(v));
        if (s.min && s.max) {
          const edge = { stroke: alpha(color, 0.35), width: 1, points: { show: false }, value };
          const of = s.spread ? " device" : "";
          series.push({ ...edge, label: `${s.name}${of} max` }, { ...edge, label: `${s.name}${of} min` });
          bands.push({ series: [series.length - 2, series.length - 1], fill: alpha(color, 0.18) });
        }
        series.push({ label: s.min && s.max ? `${s.name} mean` : s.name, stroke: color, width: 1.5, value });
      });
      const zoomHere = !this.onZoom;
      return {
        width: this.width(),
        height: this.height,
        series,
        bands,
        scales: { x: { time: false } },
        axes: [{ incrs: STEP_INCRS }, { size: axisSize, values: (u, splits) => splits.map(tick) }],
        cursor: { drag: { x: true, y: false, setScale: zoomHere } },
        legend: { live: true },
        hooks: zoomHere ? {} : {
          setSelect: [(u) => {
            const { left, width } = u.select;
            if (width < 5) return;
            const a = u.posToVal(left, "x"), b = u.posToVal(left + width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            this.onZoom([Math.floor(a), Math.ceil(b)]);
          }],
        },
      };
    }

    setData(series) {
      this.series = series;
      const data = columns(series);
      const shape = series.map((s) => `${s.name}:${Boolean(s.min && s.max)}:${Boolean(s.spread)}`).join("|");
      if (this.plot && shape === this.shape) {
        this.plot.setData(data);
      } else {
        if (this.plot) this.plot.destroy();
        this.shape = shape;
        this.plot = new uPlot(this.options(), data, this.box);
        if (this.onZoom) this.plot.over.addEventListener("dblclick", () => this.onZoom(null));
      }
      const d = this.container.dataset;
      d.series = String(series.length);
      d.plotSeries = String(this.plot.series.length - 1);
      d.points = String(series.reduce((n, s) => n + s.steps.length, 0));
      this.caption.replaceChildren(
        ...series.map((s, k) => {
          const item = document.createElement("span");
          item.className = "legend";
          item.style.setProperty("--c", COLORS[k % COLORS.length]);
          const last = s.last && s.last.length ? s.last[s.last.length - 1] : s.mean[s.mean.length - 1];
          item.textContent = `${s.name}: ${fmt(last)}`;
          if (!s.note) return item;
          const note = document.createElement("span");
          note.className = "straggler";
          note.textContent = s.note;
          const both = document.createDocumentFragment();
          both.append(item, note);
          return both;
        })
      );
    }

    draw() {
      if (this.plot) this.plot.setSize({ width: this.width(), height: this.height });
    }
  }

  return { Chart, fmt, tick };
})();
