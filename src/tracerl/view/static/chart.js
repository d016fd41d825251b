// tracerl view: small interactive SVG line charts of metrics.jsonl (no library, no CDN).
// drawChart(figure, records): one line per metric key of the figure that the run logged;
// hovering shows the nearest step's values. Redrawn whenever new records arrive.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];
  const PAD = { left: 52, right: 10, top: 8, bottom: 24 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v) {
    if (!isFinite(v)) return "";
    const a = Math.abs(v);
    return a !== 0 && (a >= 1e4 || a < 1e-2) ? v.toExponential(1) : String(+v.toFixed(3));
  }

  function seriesOf(records, keys) {
    const out = [];
    keys.forEach((key) => {
      const points = records
        .filter((r) => typeof r[key] === "number" && isFinite(r[key]))
        .map((r) => [r.step, r[key]]);
      if (points.length) out.push({ key, points });
    });
    return out;
  }

  function drawChart(figure, records) {
    const svg = figure.querySelector("svg");
    const series = seriesOf(records, figure.dataset.keys.split(","));
    figure.classList.toggle("empty", series.length === 0);
    figure.dataset.series = String(series.length);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (!series.length) return;
    const width = svg.clientWidth || 420, height = svg.clientHeight || 220;
    const all = series.flatMap((s) => s.points);
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const X = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (width - PAD.left - PAD.right);
    const Y = (y) => height - PAD.bottom - ((y - y0) / (y1 - y0)) * (height - PAD.top - PAD.bottom);
    for (let i = 0; i <= 4; i++) {
      const y = y0 + ((y1 - y0) * i) / 4;
      el("line", { x1: PAD.left, x2: width - PAD.right, y1: Y(y), y2: Y(y), stroke: "#eee" }, svg);
      el("text", { x: PAD.left - 4, y: Y(y) + 3, "text-anchor": "end", "font-size": 10 }, svg)
        .textContent = fmt(y);
    }
    // steps are whole numbers: at most five of them labelled
    const every = Math.max(1, Math.ceil((x1 - x0) / 4));
    for (let x = Math.ceil(x0); x <= x1; x += every) {
      el("text", { x: X(x), y: height - 8, "text-anchor": "middle", "font-size": 10 }, svg)
        .textContent = String(x);
    }
    series.forEach((s, i) => {
      const colour = COLOURS[i % COLOURS.length];
      const d = s.points.map((p, j) => (j ? "L" : "M") + X(p[0]) + "," + Y(p[1])).join("");
      el("path", { d, fill: "none", stroke: colour, "stroke-width": 1.5, class: "line" }, svg);
      s.points.forEach((p) => el("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2, fill: colour }, svg));
      el("text", { x: PAD.left + 6, y: PAD.top + 12 + 12 * i, fill: colour, class: "legend-item" }, svg)
        .textContent = s.key;
    });
    const cursor = el("line", { y1: PAD.top, y2: height - PAD.bottom, stroke: "#999", visibility: "hidden" }, svg);
    const tip = el("text", { class: "chart-tip", visibility: "hidden" }, svg);
    const steps = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
    svg.onmousemove = (event) => {
      const box = svg.getBoundingClientRect();
      const at = x0 + ((event.clientX - box.left - PAD.left) / (width - PAD.left - PAD.right)) * (x1 - x0);
      const step = steps.reduce((best, s) => (Math.abs(s - at) < Math.abs(best - at) ? s : best), steps[0]);
      const values = series.map((s) => {
        const hit = s.points.find((p) => p[0] === step);
        return hit ? s.key.split("/").pop() + " " + fmt(hit[1]) : null;
      }).filter(Boolean);
      cursor.setAttribute("x1", X(step)); cursor.setAttribute("x2", X(step));
      cursor.setAttribute("visibility", "visible");
      tip.textContent = "step " + step + ": " + values.join(", ");
      tip.setAttribute("x", Math.min(X(step) + 4, width - 200)); tip.setAttribute("y", height - PAD.bottom - 4);
      tip.setAttribute("visibility", "visible");
    };
    svg.onmouseleave = () => { cursor.setAttribute("visibility", "hidden"); tip.setAttribute("visibility", "hidden"); };
  }

  window.tracerlCharts = { drawChart };
})();
