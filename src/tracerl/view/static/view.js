// tracerl view: live refresh of the open page, the run page's charts, copy buttons.
// Every data-live element is re-fetched each data-refresh seconds and replaced when it changed;
// the charts redraw from /api/metrics. Read-only: only GET requests.
"use strict";
(function () {
  const refreshMs = 1000 * (parseFloat(document.body.dataset.refresh) || 2);

  async function get(url, asJson) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(url + ": " + response.status);
    return asJson ? response.json() : response.text();
  }

  function live(node) {
    let last = null;
    const tick = async () => {
      try {
        const html = await get(node.dataset.live, false);
        if (last !== null && html !== last) node.innerHTML = html;
        last = html;
      } catch (e) {
        // the run may be between writes; the next tick tries again
      }
    };
    tick();
    setInterval(tick, refreshMs);
  }

  function charts(section) {
    const status = document.getElementById("metrics-status");
    let count = -1;
    const tick = async () => {
      try {
        const data = await get(section.dataset.metrics, true);
        const steps = data.records.length;
        const problems = data.problems.join("; ");
        status.textContent = steps + " step records" + (problems ? " · " + problems : "");
        status.className = problems ? "note" : "muted";
        if (steps === count) return;
        count = steps;
        section.querySelectorAll("figure.chart").forEach((f) => window.tracerlCharts.drawChart(f, data.records));
        section.dataset.drawn = String(steps);
      } catch (e) {
        status.textContent = "metrics cannot be read now (" + e.message + "); retrying";
        status.className = "note";
      }
    };
    tick();
    setInterval(tick, refreshMs);
  }

  function copyButtons() {
    document.querySelectorAll("button[data-copy]").forEach((button) => {
      button.addEventListener("click", async () => {
        const text = document.getElementById(button.dataset.copy).textContent;
        try {
          await navigator.clipboard.writeText(text);
          button.textContent = "copied";
        } catch (e) {
          const range = document.createRange();
          range.selectNodeContents(document.getElementById(button.dataset.copy));
          window.getSelection().removeAllRanges();
          window.getSelection().addRange(range);
          button.textContent = "selected: press Ctrl-C";
        }
      });
    });
  }

  document.querySelectorAll("[data-live]").forEach(live);
  const section = document.getElementById("charts");
  if (section) charts(section);
  copyButtons();
})();
