// torchyard web view: metric charts with uPlot (shipped in this package). A run's metrics
// come downsampled from the server (LTTB); a sweep's curves are in the page.
"use strict";
(function () {
  const palette = ["#1f5fbf", "#b6410f", "#17702f", "#8a5a00", "#7b2fbf", "#0f7c8a", "#b3261e", "#5b6170"];

  // whole-number ticks: steps and intervals are counts
  const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7, 1e8, 1e9];

  function size(el) { return { width: Math.max(300, el.clientWidth - 16), height: 220 }; }

  async function runChart(fig) {
    const response = await fetch(fig.getAttribute("data-metric-url"), { headers: { "Accept": "application/json" } });
    if (!response.ok) return;
    const data = await response.json();
    const xs = data.points.map(function (p) { return p[0]; });
    const ys = data.points.map(function (p) { return p[1]; });
    const opts = Object.assign(size(fig), {
      scales: { x: { time: false } },
      series: [{ label: "step" }, { label: data.name, stroke: palette[0], width: 1.5 }],
      axes: [{ label: "step", incrs: WHOLE }, {}],
    });
    new uPlot(opts, [xs, ys], fig);
    const note = document.createElement("p");
    note.className = "count";
    note.textContent = data.points.length + " of " + data.total + " points shown";
    fig.appendChild(note);
  }

  function sweepChart(fig) {
    const data = JSON.parse(fig.getAttribute("data-curves"));
    const names = Object.keys(data.curves);
    if (!names.length) {
      const p = document.createElement("p");
      p.className = "none";
      p.textContent = "no trial has reported the metric yet";
      fig.appendChild(p);
      return;
    }
    const longest = Math.max.apply(null, names.map(function (n) { return data.curves[n].length; }));
    const xs = Array.from({ length: longest }, function (_, i) { return i + 1; });
    const series = [{ label: "interval" }];
    const columns = [xs];
    names.forEach(function (n, i) {
      const values = data.curves[n];
      const stopped = data.stopped.indexOf(n) >= 0;
      const paused = data.paused.indexOf(n) >= 0;
      columns.push(xs.map(function (_, j) { return j < values.length ? values[j] : null; }));
      series.push({
        label: n + (stopped ? " (stopped)" : "") + (paused ? " (paused)" : "") + (n === data.best ? " (best)" : ""),
        stroke: palette[i % palette.length],
        width: n === data.best ? 3 : 1.5,
        dash: stopped ? [6, 4] : paused ? [2, 3] : undefined,
        points: { show: true, size: stopped ? 7 : 4 },
      });
    });
    new uPlot(Object.assign(size(fig), { scales: { x: { time: false } }, series: series, axes: [{ label: "interval", incrs: WHOLE }, { label: data.metric }] }), columns, fig);
  }

  document.querySelectorAll("figure[data-metric-url]").forEach(runChart);
  const sweep = document.getElementById("sweep-chart");
  if (sweep) sweepChart(sweep);
})();
