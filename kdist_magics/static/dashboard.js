// kdist_magics live dashboard: an anywidget ES module. Plain DOM + SVG, no dependencies.
// Model traits: `state` (status, progress, ranks) and `curves_json` (JSON of {names, series}).

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const SVGNS = "http://www.w3.org/2000/svg";

function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function s(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function fmtTime(sec) {
  if (sec === null || sec === undefined || !isFinite(sec)) return "–";
  sec = Math.max(0, Math.round(sec));
  const m = Math.floor(sec / 60), r = sec % 60;
  return m >= 60 ? `${Math.floor(m / 60)}:${String(m % 60).padStart(2, "0")}:${String(r).padStart(2, "0")}`
                 : `${m}:${String(r).padStart(2, "0")}`;
}

function fmtNum(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : v.toPrecision(4).replace(/\.?0+$/, "");
}

function bar(label, fraction, text, cls) {
  const row = h("div", "kdist-bar " + (cls || ""));
  row.appendChild(h("span", "kdist-bar-label", label));
  const track = h("span", "kdist-bar-track");
  const fill = h("span", "kdist-bar-fill");
  const f = fraction === null || fraction === undefined || !isFinite(fraction) ? 0 : Math.min(1, Math.max(0, fraction));
  fill.style.width = `${(f * 100).toFixed(1)}%`;
  track.appendChild(fill);
  row.appendChild(track);
  row.appendChild(h("span", "kdist-bar-text", text));
  return row;
}

// One SVG chart, one polyline per rank. Returns [element, number of points drawn].
function chart(name, series, width, height) {
  const svg = s("svg", { class: "kdist-chart", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-metric": name });
  const ranks = Object.keys(series || {}).sort((a, b) => +a - +b);
  const pts = [];
  for (const r of ranks) for (const [x, y] of series[r]) if (x !== null && y !== null) pts.push([x, y]);
  const L = 46, R = 8, T = 8, B = 20;
  const W = width - L - R, H = height - T - B;
  svg.appendChild(s("rect", { x: L, y: T, width: W, height: H, class: "kdist-plot-bg" }));
  if (!pts.length) {
    const t = s("text", { x: L + W / 2, y: T + H / 2, "text-anchor": "middle", class: "kdist-axis" });
    t.textContent = `waiting for ${name}…`;
    svg.appendChild(t);
    return [svg, 0];
  }
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const X = x => L + (x - x0) / (x1 - x0) * W;
  const Y = y => T + (1 - (y - y0) / (y1 - y0)) * H;
  for (const [v, anchor] of [[y1, T + 9], [y0, T + H]]) {
    const t = s("text", { x: L - 4, y: anchor, "text-anchor": "end", class: "kdist-axis" });
    t.textContent = fmtNum(v);
    svg.appendChild(t);
  }
  for (const [v, xpos, anchor] of [[x0, L, "start"], [x1, L + W, "end"]]) {
    const t = s("text", { x: xpos, y: height - 5, "text-anchor": anchor, class: "kdist-axis" });
    t.textContent = `step ${Math.round(v)}`;
    svg.appendChild(t);
  }
  let drawn = 0;
  ranks.forEach((r, i) => {
    const line = series[r].filter(p => p[0] !== null && p[1] !== null);
    drawn += line.length;
    const pl = s("polyline", { points: line.map(p => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "),
      fill: "none", stroke: PALETTE[i % PALETTE.length], "stroke-width": 1.6, "data-rank": r,
      class: "kdist-line" });
    const title = s("title");
    title.textContent = `rank ${r}: ${name} ${fmtNum(line[line.length - 1][1])}`;
    pl.appendChild(title);
    svg.appendChild(pl);
    if (line.length === 1) {
      svg.appendChild(s("circle", { cx: X(line[0][0]), cy: Y(line[0][1]), r: 2.5, fill: PALETTE[i % PALETTE.length] }));
    }
  });
  return [svg, drawn];
}

function render({ model, el }) {
  const root = h("div", "kdist-dashboard");
  el.appendChild(root);
  let chosen = null;      // metric picked in the selector (front-end only: the kernel may be busy)
  let received = Date.now();
  let timer = null;
  // Persistent parts: the charts row (with the metric selector) is never detached, so an
  // open selector survives the live updates; `top` and `bottom` are rebuilt on each update.
  const top = h("div", "kdist-top");
  const charts = h("div", "kdist-charts");
  const lossBox = h("div", "kdist-chart-box kdist-chart-loss");
  lossBox.appendChild(h("div", "kdist-chart-title", "loss"));
  const lossHolder = h("div", "kdist-chart-holder");
  lossBox.appendChild(lossHolder);
  const metricBox = h("div", "kdist-chart-box kdist-chart-metric");
  const sel = h("select", "kdist-metric-select");
  const metricHolder = h("div", "kdist-chart-holder");
  metricBox.appendChild(sel);
  metricBox.appendChild(metricHolder);
  charts.appendChild(lossBox);
  charts.appendChild(metricBox);
  const bottom = h("div", "kdist-bottom");
  root.appendChild(top);
  root.appendChild(charts);
  root.appendChild(bottom);
  let optionsKey = "";
  sel.addEventListener("change", () => { chosen = sel.value; draw(); });

  function draw() {
    const st = model.get("state") || {};
    const cv = curves();
    const status = st.status || "running";
    root.dataset.status = status;
    top.replaceChildren();
    bottom.replaceChildren();

    // header
    const head = h("div", "kdist-head");
    const world = st.world_size != null && st.world_size !== st.size ? `${st.world_size} of ` : "";
    head.appendChild(h("span", "kdist-title", `kdist · ${st.strategy || "?"} · ${world}${st.size || 0} rank${st.size === 1 ? "" : "s"}`));
    head.appendChild(h("span", `kdist-badge kdist-status kdist-${status}`, status));
    const elapsed = st.running ? (st.elapsed || 0) + (Date.now() - received) / 1000 : st.elapsed;
    head.appendChild(h("span", "kdist-elapsed", `elapsed ${fmtTime(elapsed)}`));
    top.appendChild(head);
    if (st.reason) top.appendChild(h("div", "kdist-reason", `auto: ${st.reason}`));
    if (st.resize_note) top.appendChild(h("div", "kdist-resized", st.resize_note));  // words from messages.resized_note
    if (st.lost_note) {  // the words come from Python (kdist_magics.messages.lost_batches)
      top.appendChild(h("div", "kdist-lost", st.lost_note));
    }
    if (["failed", "interrupted", "timeout", "stopped"].includes(status) || st.error) {
      top.appendChild(h("div", `kdist-banner kdist-${status}`,
        `${status.toUpperCase()}${st.error ? ": " + st.error : ""}`));
    }

    // progress
    const p = st.progress || {};
    const parts = [];
    if (p.epochs) parts.push(`epoch ${Math.min((p.epoch || 0) + 1, p.epochs)}/${p.epochs}`);
    if (p.total_steps) parts.push(`step ${p.step || 0}/${p.total_steps}`);
    if (p.samples_per_s) parts.push(`${fmtNum(p.samples_per_s)} samples/s`);
    else if (p.steps_per_s) parts.push(`${fmtNum(p.steps_per_s)} steps/s`);
    if (p.eta_s !== null && p.eta_s !== undefined) {
      const eta = st.running ? p.eta_s - (Date.now() - received) / 1000 : p.eta_s;
      parts.push(`ETA ${fmtTime(eta)}`);
    }
    // before fit() reports, say what the run is doing (phase names come from Python)
    const ph = st.phase;
    let waiting = "waiting for fit()…";
    if (ph && !parts.length) {
      const since = (ph.elapsed || 0) + (st.running ? (Date.now() - received) / 1000 : 0);
      waiting = `${ph.name}${ph.detail ? " (" + ph.detail + ")" : ""} · ${fmtTime(since)}`;
    }
    const prog = bar("progress", p.fraction, parts.join(" · ") || waiting, "kdist-progress");
    top.appendChild(prog);
    if ((st.phases || []).length) {
      top.appendChild(h("div", "kdist-phases",
        st.phases.map(([name, secs]) => `${name} ${fmtTime(secs)}`).join(" · ")));
    }

    // curves
    const names = cv.names || [];
    const others = names.filter(n => n !== "loss");
    if (chosen === null || !names.includes(chosen)) chosen = others.find(n => !n.startsWith("val_") && n !== "lr") || others[0] || null;
    let total = 0;
    const [lossSvg, n1] = chart("loss", (cv.series || {}).loss, 330, 150);
    lossHolder.replaceChildren(lossSvg);
    total += n1;
    metricBox.style.display = others.length ? "" : "none";
    if (others.length) {
      if (others.join("\n") !== optionsKey) {  // only when the list of metrics changes
        optionsKey = others.join("\n");
        sel.replaceChildren(...others.map(n => { const o = h("option", null, n); o.value = n; return o; }));
      }
      if (sel.value !== chosen) sel.value = chosen;
      const [svg, n2] = chart(chosen, (cv.series || {})[chosen], 330, 150);
      metricHolder.replaceChildren(svg);
      total += n2;
    }
    root.dataset.points = String(total);
    // legend
    const ranks = st.ranks || [];
    const legend = h("div", "kdist-legend");
    const curveRanks = Object.keys((cv.series || {}).loss || {}).sort((a, b) => +a - +b);
    const shared = ranks.some(r => r.shared);  // in-kernel replicas: one process, one curve
    curveRanks.forEach((r, i) => {
      const item = h("span", "kdist-legend-item");
      const sw = h("span", "kdist-swatch");
      sw.style.background = PALETTE[i % PALETTE.length];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(
        shared && curveRanks.length === 1 ? `all ${ranks.length} replicas (one process)` : `rank ${r}`));
      legend.appendChild(item);
    });
    bottom.appendChild(legend);

    // one row per rank / device
    const table = h("div", "kdist-ranks");
    for (const r of ranks) {
      const row = h("div", `kdist-rank kdist-rank-${r.state}`);
      row.dataset.rank = r.rank;
      const left = h("div", "kdist-rank-id");
      left.appendChild(h("span", `kdist-badge kdist-${r.state}`, r.state));
      left.appendChild(h("span", "kdist-rank-name", `rank ${r.rank}`));
      const where = [r.host, r.pid ? `pid ${r.pid}` : null, r.device].filter(Boolean).join(" · ");
      left.appendChild(h("span", "kdist-where", where + (r.shared ? " (shared process)" : "")));
      row.appendChild(left);
      const bars = h("div", "kdist-rank-bars");
      const ncpu = r.cpu_count || 1;
      bars.appendChild(bar("CPU", r.cpu_percent === undefined || r.cpu_percent === null ? null : r.cpu_percent / (100 * ncpu),
        r.cpu_percent === undefined || r.cpu_percent === null ? "–" : `${Math.round(r.cpu_percent)}% of ${ncpu} core${ncpu === 1 ? "" : "s"}`, "kdist-cpu"));
      bars.appendChild(h("div", "kdist-rss", `RSS ${fmtBytes(r.rss_bytes)}`));
      for (const g of r.gpus || []) {
        bars.appendChild(bar(`GPU${g.index}`, g.util_percent === null ? null : g.util_percent / 100,
          g.util_percent === null ? "–" : `${Math.round(g.util_percent)}%`, "kdist-gpu"));
        bars.appendChild(bar(`mem${g.index}`, g.mem_total_bytes ? g.mem_used_bytes / g.mem_total_bytes : null,
          `${fmtBytes(g.mem_used_bytes)} / ${fmtBytes(g.mem_total_bytes)}`, "kdist-gpumem"));
      }
      for (const t of r.tpus || []) {
        bars.appendChild(t.mem_total_bytes
          ? bar(`TPU${t.index}`, t.mem_used_bytes / t.mem_total_bytes,
                `${fmtBytes(t.mem_used_bytes)} / ${fmtBytes(t.mem_total_bytes)}`, "kdist-gpumem")
          : h("div", "kdist-tpu", `TPU${t.index} memory ${fmtBytes(t.mem_used_bytes)}`));
      }
      if (!(r.gpus || []).length && !(r.tpus || []).length && r.accelerator_note) {
        bars.appendChild(h("div", "kdist-note", `accelerator: ${r.accelerator_note}`));
      }
      row.appendChild(bars);
      const right = h("div", "kdist-rank-loss");
      if (r.loss !== null && r.loss !== undefined) right.appendChild(h("div", null, `loss ${fmtNum(r.loss)}`));
      if (r.step) right.appendChild(h("div", "kdist-where", `step ${r.step}${r.total_steps ? "/" + r.total_steps : ""}`));
      row.appendChild(right);
      if (r.error) row.appendChild(h("div", "kdist-rank-error", r.error));
      table.appendChild(row);
    }
    bottom.appendChild(table);
  }

  let parsedText = null, parsed = { names: [], series: {} };
  function curves() {  // parse the curves' JSON once per change
    const text = model.get("curves_json") || "{}";
    if (text !== parsedText) {
      parsedText = text;
      try { parsed = Object.assign({ names: [], series: {} }, JSON.parse(text)); } catch (e) { /* keep the last */ }
    }
    return parsed;
  }
  function onChange() { received = Date.now(); draw(); }
  model.on("change:state", onChange);
  model.on("change:curves_json", onChange);
  draw();
  // keep elapsed/ETA ticking between updates while the run is live
  // (only the clock text, so an open metric selector is not rebuilt under the pointer)
  timer = setInterval(() => {
    const st = model.get("state") || {};
    const span = root.querySelector(".kdist-elapsed");
    if (st.running && span) span.textContent = `elapsed ${fmtTime((st.elapsed || 0) + (Date.now() - received) / 1000)}`;
  }, 1000);
  return () => {
    clearInterval(timer);
    model.off("change:state", onChange);
    model.off("change:curves_json", onChange);
  };
}

export default { render };
