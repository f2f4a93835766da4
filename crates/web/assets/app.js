// Weir's web UI: the jobs list and a job's page. Both poll the JSON views
// under /api once a second, so running jobs update without a reload.
"use strict";

const POLL_MS = 1000;
const STUCK_AFTER_MS = 10000;
const LEVELS = { DEBUG: 0, DETAILED: 1, BASIC: 2, WARNING: 3, ERROR: 4 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function time(ms) {
  return ms == null ? "" : new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function duration(ms) {
  if (ms == null) return "";
  const s = Math.round(ms / 100) / 10;
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function clip(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function count(n) {
  return n == null ? "" : Number(n).toLocaleString("en-US");
}

function watermark(w) {
  if (typeof w !== "number") return { done: "done", min: "−∞", max: "+∞ (end of time)", unknown: "…" }[w] || String(w);
  return time(w);
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
  return r.json();
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}`, text: state });
}

// ---------------------------------------------------------------- jobs list

async function jobsPage() {
  const text = document.getElementById("filter-text");
  const state = document.getElementById("filter-state");
  let jobs = [];
  const render = () => {
    const q = text.value.trim().toLowerCase();
    const want = state.value;
    const shown = jobs.filter((j) => {
      if (want === "active" && j.terminal) return false;
      if (want && want !== "active" && j.state !== want) return false;
      if (!q) return true;
      const labels = Object.entries(j.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
      return [j.id, j.name, labels, (j.sdks || []).join(" ")].join(" ").toLowerCase().includes(q);
    });
    // Rows are kept and updated in place (a row replaced under the pointer
    // would swallow a click on its link).
    const body = document.querySelector("#jobs tbody");
    const rows = new Map([...body.children].map((tr) => [tr.dataset.job, tr]));
    const wanted = shown.map((j) => {
      const tr = rows.get(j.id) || el("tr", { "data-job": j.id },
        el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(j.id)}`, text: j.id })),
        ...Array.from({ length: 7 }, () => el("td", {})));
      const cells = [j.name, null, time(j.start_ms), time(j.end_ms), duration(j.duration_ms),
        Object.entries(j.labels || {}).map(([k, v]) => `${k}=${v}`).join(", "), (j.sdks || []).join(", ")];
      cells.forEach((text, i) => {
        const td = tr.children[i + 1];
        if (text === null) {
          if (td.textContent !== j.state) td.replaceChildren(stateBadge(j.state));
        } else if (td.textContent !== text) {
          td.textContent = text;
        }
      });
      return tr;
    });
    for (const [id, tr] of rows) if (!shown.some((j) => j.id === id)) tr.remove();
    wanted.forEach((tr, i) => { if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null); });
    document.getElementById("count").textContent = `${shown.length} of ${jobs.length} job(s)`;
  };
  text.addEventListener("input", render);
  state.addEventListener("change", render);
  for (;;) {
    try { jobs = (await getJSON("/api/jobs")).jobs; render(); } catch (e) { console.error(e); }
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

// ---------------------------------------------------------------- job page

function drawGraph(job, layoutCache) {
  const graph = job.graph;
  const root = document.getElementById("graph");
  const producer = new Map();
  graph.stages.forEach((s) => s.outputs.forEach((pc) => producer.set(pc, s.index)));
  const edges = [];
  graph.stages.forEach((s) => {
    for (const [pcs, side] of [[s.inputs, false], [s.side_inputs, true]]) {
      for (const pc of pcs) {
        if (producer.has(pc)) edges.push({ from: producer.get(pc), to: s.index, pc, side });
      }
    }
  });
  if (!layoutCache.layout) {
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 46, marginx: 10, marginy: 10 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const s of graph.stages) g.setNode(String(s.index), { width: 320, height: 58 });
    edges.forEach((e, i) => g.setEdge(String(e.from), String(e.to), { width: 60, height: 16, labelpos: "c" }, `e${i}`));
    dagre.layout(g);
    layoutCache.layout = g;
  }
  const g = layoutCache.layout;
  const size = g.graph();
  root.setAttribute("viewBox", `0 0 ${Math.ceil(size.width)} ${Math.ceil(size.height)}`);
  root.setAttribute("width", Math.ceil(size.width));
  root.setAttribute("height", Math.ceil(size.height));
  const parts = [];
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  defs.append(marker);
  parts.push(defs);
  edges.forEach((e, i) => {
    const ed = g.edge(String(e.from), String(e.to), `e${i}`);
    if (!ed) return;
    const d = ed.points.map((p, k) => `${k ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    parts.push(svg("path", { d, class: e.side ? "edge side" : "edge", "marker-end": "url(#arrow)" }));
    const pc = graph.pcollections[e.pc];
    const label = svg("text", { x: ed.x, y: ed.y + 4, class: "edge-label", "data-pcollection": pc.id });
    label.textContent = pc.elements == null ? "" : count(pc.elements);
    const title = svg("title");
    title.textContent = `${pc.id}${e.side ? " (side input)" : ""}: ${pc.elements == null ? "no count yet" : count(pc.elements) + " elements"}`;
    label.append(title);
    parts.push(label);
  });
  for (const s of graph.stages) {
    const n = g.node(String(s.index));
    const p = job.progress[s.index] || {};
    const waits = job.stuck_at === s.index;
    const group = svg("g", { class: `node kind-${s.kind}${waits ? " waits" : ""}`, "data-stage": s.index,
      transform: `translate(${(n.x - n.width / 2).toFixed(1)},${(n.y - n.height / 2).toFixed(1)})` });
    group.append(svg("rect", { width: n.width, height: n.height, rx: 6 }));
    const name = s.transforms.length > 1 ? `${s.transforms[0]} +${s.transforms.length - 1}` : s.transforms[0];
    const t1 = svg("text", { x: 8, y: 18, class: "node-title" });
    t1.textContent = clip(`${s.kind === "SDK" ? "" : s.kind + ": "}${name}`, 42);
    const t2 = svg("text", { x: 8, y: 34, class: "node-counts" });
    t2.textContent = `in ${count(p.elements_in)} · out ${count(p.elements_out)}${p.in_flight ? ` · ${p.in_flight} in flight` : ""}`;
    const t3 = svg("text", { x: 8, y: 50, class: "node-wm" });
    t3.textContent = `wm ${watermark(p.input_watermark)}${waits ? "  ◀ waits here" : ""}`;
    const title = svg("title");
    title.textContent = s.transforms.join("\n");
    group.append(title, t1, t2, t3);
    parts.push(group);
  }
  root.replaceChildren(...parts);
}

function drawChart(id, series, unit) {
  const root = document.getElementById(id);
  const W = 460, H = 150, L = 44, B = 18;
  root.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const all = series.flatMap((s) => s.points);
  const parts = [];
  if (all.length < 2) {
    const t = svg("text", { x: L, y: H / 2, class: "muted" });
    t.textContent = "waiting for samples…";
    root.replaceChildren(t);
    return;
  }
  const x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  const ymax = Math.max(1e-9, ...all.map((p) => p[1])) * 1.1;
  const X = (x) => L + ((x - x0) / Math.max(1, x1 - x0)) * (W - L - 6);
  const Y = (y) => H - B - (y / ymax) * (H - B - 8);
  parts.push(svg("line", { x1: L, y1: H - B, x2: W - 6, y2: H - B, class: "axis" }));
  for (const f of [0.5, 1]) {
    const v = (ymax / 1.1) * f;
    const t = svg("text", { x: 2, y: Y(v) + 4, class: "tick" });
    t.textContent = v >= 100 ? v.toFixed(0) : v.toFixed(2);
    parts.push(t, svg("line", { x1: L, y1: Y(v), x2: W - 6, y2: Y(v), class: "grid" }));
  }
  const span = svg("text", { x: W - 6, y: H - 4, class: "tick", "text-anchor": "end" });
  span.textContent = `${Math.round((x1 - x0) / 1000)} s`;
  parts.push(span);
  series.forEach((s, i) => {
    const d = s.points.map((p, k) => `${k ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    parts.push(svg("path", { d, class: `line line-${i}` }));
    const key = svg("text", { x: L + 8 + i * 120, y: 12, class: `key key-${i}` });
    key.textContent = `${s.name} ${s.points.length ? s.points[s.points.length - 1][1].toFixed(2) : ""} ${unit}`;
    parts.push(key);
  });
  root.replaceChildren(...parts);
}

function charts(job) {
  const h = job.resources.history;
  const rate = (col) => h.slice(1).map((p, i) => [p[0], Math.max(0, (p[col] - h[i][col]) / Math.max(1, p[0] - h[i][0]))]);
  drawChart("cpu-chart", [{ name: "runner", points: rate(1) }, { name: "SDK", points: rate(3) }], "cores");
  const mib = (col) => h.map((p) => [p[0], p[col] / (1 << 20)]);
  drawChart("mem-chart", [{ name: "runner", points: mib(2) }, { name: "SDK", points: mib(4) }], "MiB");
}

function stagesTable(job, previous) {
  const body = document.querySelector("#stages tbody");
  const dt = previous ? (job.now_ms - previous.now_ms) / 1000 : 0;
  body.replaceChildren(...job.graph.stages.map((s) => {
    const p = job.progress[s.index] || {};
    const before = previous && previous.progress[s.index];
    const rate = before && dt > 0 ? Math.max(0, (p.elements_in - before.elements_in) / dt) : null;
    return el("tr", { "data-stage": s.index, class: job.stuck_at === s.index ? "waits" : "" },
      el("td", { text: s.index }),
      el("td", { title: s.transforms.join("\n"), text: s.name.length > 80 ? s.name.slice(0, 80) + "…" : s.name }),
      el("td", { text: s.kind }),
      el("td", { class: "num elements-in", text: count(p.elements_in) }),
      el("td", { class: "num elements-out", text: count(p.elements_out) }),
      el("td", { class: "num", text: rate == null ? "" : count(Math.round(rate)) }),
      el("td", { class: "num", text: count(p.bundles) }),
      el("td", { class: "num", text: count(p.in_flight) }),
      el("td", { class: "num", text: count(p.retries) }),
      el("td", { class: "input-watermark", "data-value": String(p.input_watermark), text: watermark(p.input_watermark) }),
      el("td", { class: "output-watermark", "data-value": String(p.output_watermark), text: watermark(p.output_watermark) }),
      el("td", { class: "num", text: p.watermark_lag_ms == null ? "" : duration(p.watermark_lag_ms) }),
    );
  }));
}

function userMetrics(job) {
  const body = document.querySelector("#user-metrics tbody");
  body.replaceChildren(...job.user_metrics.map((m) => el("tr", {},
    el("td", { text: m.step }), el("td", { text: m.namespace }), el("td", { text: m.name }), el("td", { text: m.kind }),
    el("td", { class: "num", text: typeof m.value === "object" && m.value ? JSON.stringify(m.value) : count(m.value) }))));
  if (!job.user_metrics.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "none reported" })));
}

function options(job) {
  const body = document.querySelector("#options tbody");
  // Beam's portable spelling beam:option:NAME:v1, shown as the SDK's --NAME.
  const name = (k) => k.replace(/^beam:option:/, "").replace(/:v1$/, "");
  body.replaceChildren(...Object.keys(job.options).sort((a, b) => name(a).localeCompare(name(b))).map((k) => el("tr", {},
    el("th", { title: k, text: "--" + name(k) }),
    el("td", { text: typeof job.options[k] === "string" ? job.options[k] : JSON.stringify(job.options[k]) }))));
}

function header(job) {
  document.title = `Weir: ${job.name}`;
  document.getElementById("job-name").textContent = job.name;
  document.getElementById("job-state").replaceChildren(stateBadge(job.state));
  document.getElementById("job-meta").textContent =
    `${job.id} · ${job.streaming ? "streaming" : "batch"} · started ${time(job.start_ms) || "(not yet)"}` +
    `${job.end_ms ? " · ended " + time(job.end_ms) : ""} · ${duration(job.duration_ms)} · ${(job.sdks || []).join(", ")}`;
  for (const b of ["cancel", "drain"]) document.getElementById(b).disabled = job.terminal;
  const waits = document.getElementById("waits");
  const at = job.stuck_at != null ? job.graph.stages[job.stuck_at] : null;
  waits.hidden = !at;
  if (at) {
    waits.textContent = `no progress for ${duration(job.idle_ms)}: the job waits at stage ${at.index} (${clip(at.name, 100)}), ` +
      `input watermark ${watermark(job.progress[at.index].input_watermark)}`;
  }
}

function logsPanel(id) {
  const entries = [];
  let last = null;
  const level = document.getElementById("log-level");
  const text = document.getElementById("log-text");
  const follow = document.getElementById("log-follow");
  const pre = document.getElementById("logs");
  const render = () => {
    const min = Number(level.value);
    const q = text.value.toLowerCase();
    const shown = entries.filter((e) => (LEVELS[e.importance] ?? 2) >= min && (!q || e.text.toLowerCase().includes(q)));
    pre.replaceChildren(...shown.slice(-2000).map((e) => el("div", { class: `log log-${e.importance}` },
      el("span", { class: "log-time", text: e.time.replace("T", " ").replace(/\.\d+Z$/, "Z") + " " }),
      el("span", { class: "log-level", text: e.importance.padEnd(8) }),
      el("span", { class: "log-text", text: e.text }))));
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  };
  level.addEventListener("change", render);
  text.addEventListener("input", render);
  return async (terminal) => {
    if (!follow.checked && last !== null && !terminal) return;
    const r = await getJSON(`/api/jobs/${encodeURIComponent(id)}/logs${last === null ? "" : "?after=" + last}`);
    entries.push(...r.entries);
    if (entries.length > 10000) entries.splice(0, entries.length - 10000);
    last = r.last;
    if (r.entries.length || last === 0) render();
  };
}

async function jobPage() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  const layoutCache = {};
  const pollLogs = logsPanel(id);
  for (const action of ["cancel", "drain"]) {
    document.getElementById(action).addEventListener("click", async () => {
      const r = await fetch(`/api/jobs/${encodeURIComponent(id)}/${action}`, { method: "POST" });
      if (!r.ok) alert(await r.text());
    });
  }
  let previous = null;
  let optionsShown = false;
  // A running job is marked stuck, at the stage it waits at, once its
  // counts and watermarks have not changed for STUCK_AFTER_MS.
  let fingerprint = null;
  let changed = Date.now();
  for (;;) {
    try {
      const job = await getJSON(`/api/jobs/${encodeURIComponent(id)}`);
      // (The lag behind the wall clock grows by itself: not progress.)
      const now = JSON.stringify(job.progress.map(({ watermark_lag_ms, ...p }) => p));
      if (now !== fingerprint) { fingerprint = now; changed = Date.now(); }
      job.idle_ms = Date.now() - changed;
      job.stuck_at = job.state === "RUNNING" && job.idle_ms >= STUCK_AFTER_MS ? job.waits_at : null;
      header(job);
      drawGraph(job, layoutCache);
      stagesTable(job, previous);
      charts(job);
      userMetrics(job);
      if (!optionsShown) { options(job); optionsShown = true; }
      await pollLogs(job.terminal);
      previous = job;
      if (job.terminal) {
        // One last refresh a moment later picks up the final counts.
        if (job.end_ms && job.now_ms - job.end_ms > 3000) break;
      }
    } catch (e) {
      console.error(e);
      document.getElementById("job-meta").textContent = String(e);
    }
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

if (document.body.dataset.page === "jobs") jobsPage(); else jobPage();
