// torchyard web view: live refresh of phases (runs list and run page) and the log tail
// that follows. Text from the cluster is only ever set as textContent, never as HTML.
"use strict";
(function () {
  const token = document.querySelector('meta[name="torchyard-token"]').content;

  // (the class of each phase's badge comes with it: html.PHASE_CLASSES, one copy)
  function setPhase(name, phase, phaseClass) {
    document.querySelectorAll("[data-phase]").forEach(function (holder) {
      if (holder.getAttribute("data-phase") !== name) return;
      const badge = holder.querySelector(".badge");
      if (badge && badge.textContent !== phase) {
        badge.textContent = phase;
        badge.className = "badge " + (phaseClass || "");
      }
    });
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { "Accept": "application/json", "X-Torchyard-Token": token } });
    if (!response.ok) return null;
    return response.json();
  }

  // the runs list: the phases of the rows shown, every few seconds
  const list = document.querySelector('table[data-refresh="runs"]');
  if (list) {
    const url = "/api" + location.pathname + location.search;
    setInterval(async function () {
      const data = await getJSON(url);
      if (data) data.items.forEach(function (r) { setPhase(r.name, r.phase, r.phaseClass); });
    }, 3000);
  }

  // a run's page: its phase, and the log tail of the chosen node and rank
  const head = document.querySelector(".head[data-run]");
  if (head) {
    const run = head.getAttribute("data-run");
    setInterval(async function () {
      const data = await getJSON("/api" + location.pathname);
      if (data) setPhase(run, data.phase, data.phaseClass);
    }, 3000);
  }
  const bar = document.querySelector(".logbar[data-log-url]");
  if (bar) {
    const out = document.getElementById("log");
    const node = document.getElementById("log-node");
    const rank = document.getElementById("log-rank");
    const follow = document.getElementById("log-follow");
    let busy = false;
    async function tail() {
      if (busy) return;
      busy = true;
      try {
        const q = new URLSearchParams({ node: node.value, lines: "200" });
        if (rank.value !== "") q.set("rank", rank.value);
        const data = await getJSON(bar.getAttribute("data-log-url") + "?" + q.toString());
        if (data) {
          const text = data.lines.length ? data.lines.join("\n") : "(" + (data.note || "no lines yet") + ")";
          if (out.textContent !== text) {
            out.textContent = text;
            if (follow.checked) out.scrollTop = out.scrollHeight;
          }
        }
      } finally {
        busy = false;
      }
    }
    node.addEventListener("change", tail);
    rank.addEventListener("change", tail);
    tail();
    setInterval(function () { if (follow.checked) tail(); }, 500);
  }
})();
