// The quality dashboard's plots, drawn with uPlot (static/vendor/uplot) from the page's "quality-plots" JSON:
// daily throughput over time, and acceptance of each model version's proposals. The charts are kept on
// window.qualityCharts (tests read their data from there).
(function () {
  const COLORS = { trajectories: "#2563eb", steps: "#16a34a", accepted: "#16a34a", edited: "#d97706", overridden: "#dc2626" };

  function width(el) {
    return Math.max(280, el.clientWidth || 480);
  }

  function empty(el, message) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = message;
    el.replaceChildren(p);
    return null;
  }

  function throughput(el, data) {
    if (!data.x.length) return empty(el, "No submissions or steps in this window.");
    const opts = {
      width: width(el),
      height: 240,
      series: [
        {},
        { label: "trajectories", stroke: COLORS.trajectories, width: 2, scale: "t" },
        { label: "steps", stroke: COLORS.steps, width: 2, scale: "s" },
      ],
      axes: [{}, { scale: "t", label: "trajectories" }, { scale: "s", side: 1, label: "steps", grid: { show: false } }],
    };
    const chart = new uPlot(opts, [data.x, data.trajectories, data.steps], el);
    // At least a week wide and a day past the last point: with one day of data uPlot's own range ran years ahead.
    const first = data.x[0], last = data.x[data.x.length - 1];
    chart.setScale("x", { min: Math.min(first, last - 7 * 86400) - 43200, max: last + 86400 });
    return chart;
  }

  function acceptance(el, data) {
    if (!data.models.length) return empty(el, "No model proposals recorded yet.");
    const x = data.models.map((_, i) => i);
    const names = data.models;
    const series = ["accepted", "edited", "overridden"].map((key) => ({
      label: key + " %",
      stroke: COLORS[key],
      width: 2,
      points: { show: true, size: 7 },
    }));
    const opts = {
      width: width(el),
      height: 240,
      scales: { x: { time: false, range: [-0.5, Math.max(0.5, names.length - 0.5)] }, y: { range: [0, 100] } },
      series: [{ label: "model", value: (u, i) => (i == null ? "" : names[i] ?? "") }, ...series],
      axes: [
        { splits: () => x, values: (u, splits) => splits.map((i) => names[i] ?? "") },
        { label: "% of proposals" },
      ],
    };
    return new uPlot(opts, [x, data.accepted, data.edited, data.overridden], el);
  }

  function draw() {
    const source = document.getElementById("quality-plots");
    if (!source || typeof uPlot === "undefined") return;
    const data = JSON.parse(source.textContent);
    window.qualityCharts = {
      throughput: throughput(document.getElementById("plot-throughput"), data.throughput),
      acceptance: acceptance(document.getElementById("plot-acceptance"), data.acceptance),
    };
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
