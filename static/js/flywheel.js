// The iteration page's training curves: one inline SVG line chart per metric (loss, reward, …) of each training
// stage, drawn from the stage entry's `metrics` rows ({step, total_steps, loss, reward, …}). First from the rows the
// page was drawn with (#iteration-stages), then again from every `flywheel_iteration` websocket event for this
// iteration (events.js turns it into "page:flywheel_iteration" on <body>, detail = {iteration: {id, stages, …}}).
(function () {
  const root = document.getElementById("training-plots");
  if (!root) return;
  const iterationId = Number(root.dataset.iteration);
  const SVG = "http://www.w3.org/2000/svg";
  const NOT_PLOTTED = new Set(["step", "total_steps", "epoch", "time", "elapsed", "elapsed_s", "timestamp", "seconds"]);
  const FIRST = ["loss", "reward"];
  const MAX_CHARTS = 6;
  const W = 320, H = 130, PAD = { left: 46, right: 10, top: 18, bottom: 22 };

  function isNumber(v) { return typeof v === "number" && Number.isFinite(v); }

  function metricKeys(rows) {
    const keys = new Set();
    for (const row of rows) for (const [k, v] of Object.entries(row)) if (isNumber(v) && !NOT_PLOTTED.has(k)) keys.add(k);
    const ordered = FIRST.filter((k) => keys.has(k)).concat([...keys].filter((k) => !FIRST.includes(k)).sort());
    return ordered.slice(0, MAX_CHARTS);
  }

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(v) { return Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : v.toPrecision(3); }

  function chart(rows, key) {
    const points = rows.map((r, i) => [isNumber(r.step) ? r.step : i, r[key]]).filter(([, y]) => isNumber(y));
    const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "fw-plot", role: "img",
      "data-metric": key, "data-points": points.length, "aria-label": `${key} by step` });
    svg.appendChild(el("text", { x: PAD.left, y: 12, "font-size": 12, "font-weight": 600, fill: "#1d2330" }, key));
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
    svg.appendChild(el("rect", { x: PAD.left, y: PAD.top, width: W - PAD.left - PAD.right,
      height: H - PAD.top - PAD.bottom, fill: "#f6f7fb", stroke: "#e3e6ee" }));
    const label = { "font-size": 10, fill: "#6b7385" };
    svg.appendChild(el("text", { ...label, x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, fmt(y1)));
    svg.appendChild(el("text", { ...label, x: PAD.left - 4, y: H - PAD.bottom, "text-anchor": "end" }, fmt(y0)));
    svg.appendChild(el("text", { ...label, x: PAD.left, y: H - 6 }, `step ${x0}`));
    svg.appendChild(el("text", { ...label, x: W - PAD.right, y: H - 6, "text-anchor": "end" }, `${x1}`));
    if (points.length) {
      const d = points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
      svg.appendChild(el("polyline", { points: d, fill: "none", stroke: "#3556d8", "stroke-width": 1.5 }));
      const [lx, ly] = points[points.length - 1];
      svg.appendChild(el("circle", { cx: sx(lx).toFixed(1), cy: sy(ly).toFixed(1), r: 2.5, fill: "#3556d8" }));
      svg.appendChild(el("text", { ...label, x: W - PAD.right, y: 12, "text-anchor": "end" }, `last ${fmt(ly)}`));
    }
    return svg;
  }

  function draw(stages) {
    for (const box of root.querySelectorAll(".fw-stage-plots")) {
      const entry = (stages || {})[box.dataset.stage] || {};
      const rows = Array.isArray(entry.metrics) ? entry.metrics.filter((r) => r && typeof r === "object") : [];
      const title = box.querySelector("h3");
      box.replaceChildren(...(title ? [title] : []));
      const keys = metricKeys(rows);
      if (!keys.length) {
        const p = document.createElement("p");
        p.className = "muted";
        p.textContent = "No metrics yet.";
        box.appendChild(p);
        continue;
      }
      for (const key of keys) box.appendChild(chart(rows, key));
    }
  }

  const initial = document.getElementById("iteration-stages");
  draw(initial ? JSON.parse(initial.textContent || "{}") : {});
  document.body.addEventListener("page:flywheel_iteration", (event) => {
    const iteration = event.detail && event.detail.iteration;
    if (iteration && Number(iteration.id) === iterationId && iteration.stages) draw(iteration.stages);
  });
})();
