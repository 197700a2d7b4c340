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

export function fmtNum(v) {  // 0.0123, 12.35, 29,060 (not toPrecision's "2.906e+4"), 1.23e+9
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e9)) return v.toExponential(2);
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  return v.toPrecision(4).replace(/\.?0+$/, "");
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

// a rank's step split as one stacked bar (watch/split.py): scaled to the longest rank's step
export const SPLIT_PARTS = [["compute", "compute"], ["communication", "communication"],
  ["wait", "wait for slower ranks"], ["in_step", "in step"], ["rest", "rest"]];
export function splitBar(split, longest) {
  const row = h("div", "kdist-bar kdist-split");
  row.appendChild(h("span", "kdist-bar-label", "step"));
  const track = h("span", "kdist-bar-track");
  const ms = v => `${v >= 0.01 ? Math.round(v * 1000) : +(v * 1000).toPrecision(2)} ms`;
  const words = [];
  for (const [key, name] of SPLIT_PARTS) {
    const v = split[key];
    if (v === undefined || v === null) continue;
    const seg = h("span", `kdist-split-seg kdist-split-${key}`);
    seg.style.width = `${(longest > 0 ? Math.min(1, v / longest) * 100 : 0).toFixed(1)}%`;
    seg.title = `${name} ${ms(v)}`;
    track.appendChild(seg);
    words.push(`${name} ${ms(v)}`);
  }
  row.appendChild(track);
  row.appendChild(h("span", "kdist-bar-text", words.join(" · ")));
  return row;
}

// -- axes: the rules of kdist_magics/watch/axes.py (tests/test_dashboard_js.py compares the two) --
export const LOG_SPAN = 10, SMOOTHING = 0.6;
const clean = v => +v.toPrecision(12);

export function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

export function linearRange(lo, hi, count = 5) {  // [axis low, axis high, ticks]
  if (!(hi > lo)) { const pad = Math.abs(lo) * 0.05 || 1; lo -= pad; hi += pad; }
  const step = niceStep(hi - lo, count);
  const a = clean(Math.floor(lo / step + 1e-9) * step), b = clean(Math.ceil(hi / step - 1e-9) * step);
  const n = Math.round((b - a) / step), ticks = [];
  for (let i = 0; i <= n; i++) ticks.push(clean(a + i * step));
  return [a, b, ticks];
}

export function logRange(lo, hi) {  // positive data: whole decades, 2 and 5 (or 3) between
  const a = Math.floor(Math.log10(lo) + 1e-9);
  let b = Math.ceil(Math.log10(hi) - 1e-9);
  if (b <= a) b = a + 1;
  const decades = b - a;
  const mults = decades <= 1 ? [1, 2, 5] : decades <= 3 ? [1, 3] : [1];
  const every = Math.max(1, Math.ceil(decades / 6)), ticks = [];
  for (let e = a; e <= b; e++) {
    if ((e - a) % every) continue;
    for (const m of mults) if (e < b || m === 1) ticks.push(clean(m * Math.pow(10, e)));
  }
  return [clean(Math.pow(10, a)), clean(Math.pow(10, b)), ticks];
}

export function wantsLog(values) {
  const v = values.filter(x => x !== null && x !== undefined);
  return v.length > 0 && Math.min(...v) > 0 && Math.max(...v) / Math.min(...v) > LOG_SPAN;
}

export function smooth(values, weight = SMOOTHING) {  // TensorBoard's debiased moving average
  let last = 0;
  return values.map((v, i) => { last = last * weight + (1 - weight) * v; return last / (1 - Math.pow(weight, i + 1)); });
}

export function titleText(st) {  // "kdist · sharded, mesh 1x4 · 4 ranks" (svg.py says the same)
  const world = st.world_size != null && st.world_size !== st.size ? `${st.world_size} of ` : "";
  const mesh = st.mesh ? `, mesh ${st.mesh}` : "";
  return `kdist · ${st.strategy || "?"}${mesh} · ${world}${st.size || 0} rank${st.size === 1 ? "" : "s"}`;
}

export function tickLabel(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a < 1e-3 || a >= 1e5) { const [m, e] = v.toExponential(0).split("e"); return `${m}e${+e}`; }
  return String(+v.toPrecision(3));
}

function nearest(line, x) {  // the point of a line (sorted by step) nearest to step x
  let lo = 0, hi = line.length - 1;
  while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (line[mid][0] < x) lo = mid; else hi = mid; }
  return Math.abs(line[lo][0] - x) <= Math.abs(line[hi][0] - x) ? line[lo] : line[hi];
}

const usable = line => (line || []).filter(p => p[0] !== null && p[1] !== null);

// One SVG chart: a line per rank (training), hollow points per epoch (validation), ticks.
// `o`: {log, smooth, hoverX, width, height}. Returns {svg, drawn, toX, fromX, lines, val}.
function chart(name, series, val, o) {
  const { width, height } = o;
  const svg = s("svg", { class: "kdist-chart", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-metric": name, "data-scale": o.log ? "log" : "linear" });
  const ranks = Object.keys(series || {}).sort((a, b) => +a - +b);
  const lines = {}, vals = {};
  for (const r of ranks) lines[r] = usable(series[r]);
  for (const r of Object.keys(val || {})) vals[r] = usable(val[r]);
  const all = [...Object.values(lines), ...Object.values(vals)].flat();
  const L = 44, R = 8, T = 6, B = 28;
  const W = width - L - R, H = height - T - B;
  svg.appendChild(s("rect", { x: L, y: T, width: W, height: H, class: "kdist-plot-bg" }));
  const out = { svg, drawn: 0, lines, vals, plot: { L, T, W, H } };
  if (!all.length) {
    const t = s("text", { x: L + W / 2, y: T + H / 2, "text-anchor": "middle", class: "kdist-axis" });
    t.textContent = `waiting for ${name}…`;
    svg.appendChild(t);
    return out;
  }
  const ys = all.map(p => p[1]);
  const log = o.log && Math.min(...ys) > 0;
  const [y0, y1, yTicks] = log ? logRange(Math.min(...ys), Math.max(...ys)) : linearRange(Math.min(...ys), Math.max(...ys));
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  if (x1 <= x0) x1 = x0 + 1;
  const f = log ? Math.log10 : (v => v);
  const X = x => L + (x - x0) / (x1 - x0) * W;
  const Y = y => T + (1 - (f(y) - f(y0)) / (f(y1) - f(y0))) * H;
  out.toX = X;
  out.fromX = px => x0 + (px - L) / W * (x1 - x0);
  const ax = { svg, L, T, W, H, X, Y, height };
  ticks(ax, yTicks, linearRange(x0, x1, 4)[2].filter(v => v >= x0 - 1e-9 && v <= x1 + 1e-9));
  const colour = r => PALETTE[(+r) % PALETTE.length];  // as the legend and rank rows
  out.drawn = curveLines(ax, ranks, lines, o.smooth, colour) + valPoints(ax, vals, colour);
  if (o.hoverX !== null && o.hoverX !== undefined) out.hoverStep = guide(ax, ranks, lines, o.hoverX, colour);
  out.colour = colour;
  return out;
}

// the value ticks with their grid lines, the step ticks, the axis' name
function ticks({ svg, L, T, W, H, X, Y, height }, yTicks, xTicks) {
  for (const v of yTicks) {
    const y = Y(v);
    svg.appendChild(s("line", { x1: L, x2: L + W, y1: y, y2: y, class: "kdist-grid" }));
    const t = s("text", { x: L - 4, y: y + 3, "text-anchor": "end", class: "kdist-axis kdist-ytick" });
    t.textContent = tickLabel(v);
    svg.appendChild(t);
  }
  for (const v of xTicks) {
    const x = X(v);
    svg.appendChild(s("line", { x1: x, x2: x, y1: T + H, y2: T + H + 3, class: "kdist-tickmark" }));
    const t = s("text", { x, y: T + H + 13, "text-anchor": "middle", class: "kdist-axis kdist-xtick" });
    t.textContent = tickLabel(v);
    svg.appendChild(t);
  }
  const label = s("text", { x: L + W, y: height - 2, "text-anchor": "end", class: "kdist-axis" });
  label.textContent = "step";
  svg.appendChild(label);
}

// one line per rank (raw and smoothed when smoothing is on); returns the points drawn
function curveLines({ svg, X, Y }, ranks, lines, smoothed, colour) {
  const path = (line, cls, extra) => s("polyline", Object.assign({
    points: line.map(p => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "), fill: "none",
    class: cls }, extra));
  let drawn = 0;
  for (const r of ranks) {
    const line = lines[r];
    if (!line.length) continue;
    drawn += line.length;
    if (smoothed && line.length > 2) {
      svg.appendChild(path(line, "kdist-line kdist-raw", { stroke: colour(r), "data-rank": r }));
      const sm = smooth(line.map(p => p[1]));
      svg.appendChild(path(line.map((p, i) => [p[0], sm[i]]), "kdist-line kdist-smoothed",
        { stroke: colour(r), "data-rank": r }));
    } else {
      svg.appendChild(path(line, "kdist-line", { stroke: colour(r), "data-rank": r }));
    }
    if (line.length === 1) svg.appendChild(s("circle", { cx: X(line[0][0]), cy: Y(line[0][1]), r: 2.5, fill: colour(r) }));
  }
  return drawn;
}

// validation: a hollow point per epoch and rank; returns the points drawn
function valPoints({ svg, X, Y }, vals, colour) {
  let drawn = 0;
  for (const [r, pts] of Object.entries(vals)) {
    for (const p of pts) {
      svg.appendChild(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3.2, class: "kdist-val", stroke: colour(r),
        "data-rank": r }));
      drawn += 1;
    }
  }
  return drawn;
}

// the hover guide at the step nearest to `hoverX`, a dot on each rank's line; returns the step
function guide({ svg, T, H, X, Y }, ranks, lines, hoverX, colour) {
  const near = Object.values(lines).filter(l => l.length).map(l => nearest(l, hoverX));
  if (!near.length) return undefined;
  const step = near.reduce((a, p) => Math.abs(p[0] - hoverX) < Math.abs(a - hoverX) ? p[0] : a, near[0][0]);
  svg.appendChild(s("line", { x1: X(step), x2: X(step), y1: T, y2: T + H, class: "kdist-guide" }));
  for (const r of ranks) {
    if (!lines[r].length) continue;
    const p = nearest(lines[r], step);
    svg.appendChild(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: colour(r), class: "kdist-hover-dot" }));
  }
  return step;
}

// a labelled checkbox: [label, input]
function toggle(text, cls, title) {
  const label = h("label", `kdist-toggle ${cls}`);
  label.title = title;
  const input = h("input");
  input.type = "checkbox";
  label.append(input, document.createTextNode(text));
  return [label, input];
}

function readout(tip, c) {  // the hover read-out: the step, its epoch, each rank's value
  tip.replaceChildren();
  if (c.hoverStep === undefined) { tip.style.display = "none"; return; }
  const ranks = Object.keys(c.lines).filter(r => c.lines[r].length).sort((a, b) => +a - +b);
  const first = nearest(c.lines[ranks[0]], c.hoverStep);
  const epoch = first[2] === undefined || first[2] === null ? "" : ` · epoch ${first[2] + 1}`;
  tip.appendChild(h("div", "kdist-tip-head", `step ${c.hoverStep}${epoch}`));
  for (const r of ranks) {
    const p = nearest(c.lines[r], c.hoverStep);
    const row = h("div", "kdist-tip-row");
    const sw = h("span", "kdist-swatch");
    sw.style.background = c.colour(r);
    const v = (c.vals[r] || []).find(q => q[2] !== undefined && q[2] === p[2]);
    row.append(sw, document.createTextNode(`rank ${r}: ${fmtNum(p[1])}${v ? ` · val ${fmtNum(v[1])}` : ""}`));
    tip.appendChild(row);
  }
  tip.style.display = "";
  const x = c.toX(c.hoverStep), w = +c.svg.getAttribute("width");
  tip.style.left = x > w / 2 ? "" : `${x + 8}px`;
  tip.style.right = x > w / 2 ? `${w - x + 8}px` : "";
}

// A chart with its own log and smoothing toggles and a hover read-out. The user's choices are
// kept per metric across the live updates (front-end only: the kernel may be busy training).
function chartBox(titleEl) {
  const box = h("div", "kdist-chart-box");
  const head = h("div", "kdist-chart-head");
  const [logLabel, logInput] = toggle("log", "kdist-log", "logarithmic value axis");
  const [smoothLabel, smoothInput] = toggle("smooth", "kdist-smooth", "moving average (TensorBoard's, weight 0.6)");
  head.append(titleEl, logLabel, smoothLabel);
  const holder = h("div", "kdist-chart-holder");
  const tip = h("div", "kdist-tip");
  box.append(head, holder);
  const prefs = {};
  let name = null, series = null, val = null, hoverX = null, drawnChart = null, ranksInfo = [];
  const pref = () => (prefs[name] = prefs[name] || { log: null, smooth: false });
  logInput.addEventListener("change", () => { pref().log = logInput.checked; redraw(); });
  smoothInput.addEventListener("change", () => { pref().smooth = smoothInput.checked; redraw(); });
  holder.addEventListener("mousemove", ev => {
    if (!drawnChart || !drawnChart.fromX) return;
    const rect = drawnChart.svg.getBoundingClientRect();
    const px = (ev.clientX - rect.left) * (+drawnChart.svg.getAttribute("width") / (rect.width || 1));
    const { L, W } = drawnChart.plot;
    hoverX = px < L - 4 || px > L + W + 4 ? null : drawnChart.fromX(Math.min(L + W, Math.max(L, px)));
    redraw();
  });
  holder.addEventListener("mouseleave", () => { hoverX = null; redraw(); });

  function redraw() {
    if (name === null) return;
    const p = pref();
    const values = [...Object.values(series || {}), ...Object.values(val || {})].flat().map(q => q[1]);
    const positive = values.length > 0 && Math.min(...values.filter(v => v !== null)) > 0;
    const log = positive && (p.log === null ? wantsLog(values) : p.log);
    logInput.checked = log;
    logInput.disabled = !positive;
    smoothInput.checked = p.smooth;
    drawnChart = chart(name, series, val, { log, smooth: p.smooth, hoverX, width: 350, height: 170 });
    holder.replaceChildren(drawnChart.svg, tip);
    readout(tip, drawnChart);
  }

  return {
    box,
    update(metric, s2, v2) { name = metric; series = s2; val = v2; redraw(); return drawnChart ? drawnChart.drawn : 0; },
  };
}

// the header: title, status, elapsed; why auto chose, layout, resize and straggler notes; the banner
function headRows(st, status, received) {
  const rows = [];
  const head = h("div", "kdist-head");
  head.appendChild(h("span", "kdist-title", titleText(st)));
  head.appendChild(h("span", `kdist-badge kdist-status kdist-${status}`, status));
  const elapsed = st.running ? (st.elapsed || 0) + (Date.now() - received) / 1000 : st.elapsed;
  head.appendChild(h("span", "kdist-elapsed", `elapsed ${fmtTime(elapsed)}`));
  rows.push(head);
  if (st.reason) rows.push(h("div", "kdist-reason", `auto: ${st.reason}`));
  if (st.layout_note) rows.push(h("div", "kdist-layout", st.layout_note));  // words from messages.layout_per_device
  if (st.resize_note) rows.push(h("div", "kdist-resized", st.resize_note));  // words from messages.resized_note
  for (const note of st.stragglers || []) rows.push(h("div", "kdist-straggler-note", `straggler: ${note}`));
  if (st.lost_note) {  // the words come from Python (kdist_magics.messages.lost_batches)
    rows.push(h("div", "kdist-lost", st.lost_note));
  }
  if (["failed", "interrupted", "timeout", "stopped"].includes(status) || st.error) {
    rows.push(h("div", `kdist-banner kdist-${status}`,
      `${status.toUpperCase()}${st.error ? ": " + st.error : ""}`));
  }
  return rows;
}

// the progress bar (epoch, step, throughput, ETA; before fit() reports, the phase) and the phases
function progressRows(st, received) {
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
  let waiting = st.idle_note || "waiting for fit()…";  // idle_note: finished, trained nothing
  if (ph && !parts.length && !st.idle_note) {
    const since = (ph.elapsed || 0) + (st.running ? (Date.now() - received) / 1000 : 0);
    waiting = `${ph.name}${ph.detail ? " (" + ph.detail + ")" : ""} · ${fmtTime(since)}`;
  }
  const rows = [bar("progress", p.fraction, parts.join(" · ") || waiting, "kdist-progress")];
  if ((st.phases || []).length) {
    rows.push(h("div", "kdist-phases",
      st.phases.map(([name, secs]) => `${name} ${fmtTime(secs)}`).join(" · ")));
  }
  return rows;
}

// the curves' legend: a swatch per rank (in-kernel replicas: one), and validation's points
function legend(cv, ranks, validation) {
  const box = h("div", "kdist-legend");
  const curveRanks = Object.keys((cv.series || {}).loss || {}).sort((a, b) => +a - +b);
  const shared = ranks.some(r => r.shared);  // in-kernel replicas: one process, one curve
  curveRanks.forEach(r => {
    const item = h("span", "kdist-legend-item");
    const sw = h("span", "kdist-swatch");
    sw.style.background = PALETTE[(+r) % PALETTE.length];
    item.appendChild(sw);
    item.appendChild(document.createTextNode(
      shared && curveRanks.length === 1 ? `all ${ranks.length} replicas (one process)` : `rank ${r}`));
    box.appendChild(item);
  });
  if (validation) {
    const item = h("span", "kdist-legend-item kdist-legend-val");
    item.appendChild(h("span", "kdist-val-swatch"));
    item.appendChild(document.createTextNode("validation (per epoch)"));
    box.appendChild(item);
  }
  return box;
}

// one rank's row: its badges and where it runs, its bars, its loss and step time, its error
function rankRow(r, longest) {
  const row = h("div", `kdist-rank kdist-rank-${r.state}${r.straggler ? " kdist-rank-straggler" : ""}`);
  row.dataset.rank = r.rank;
  const left = h("div", "kdist-rank-id");
  const badges = h("span", "kdist-badges");
  badges.appendChild(h("span", `kdist-badge kdist-${r.state}`, r.state));
  if (r.straggler) {
    const b = h("span", "kdist-badge kdist-straggler", "straggler");
    b.title = r.straggler;
    badges.appendChild(b);
  }
  left.appendChild(badges);
  left.appendChild(h("span", "kdist-rank-name", `rank ${r.rank}`));
  const where = [r.host, r.node, r.pid ? `pid ${r.pid}` : null, r.device].filter(Boolean).join(" · ");
  left.appendChild(h("span", "kdist-where", where + (r.shared ? " (shared process)" : "")));
  row.append(left, rankBars(r, longest), rankSide(r));
  if (r.error) row.appendChild(h("div", "kdist-rank-error", r.error));
  return row;
}

// a rank's bars: CPU, memory, each GPU and TPU, the step split, and where the figures came from
function rankBars(r, longest) {
  const bars = h("div", "kdist-rank-bars");
  const ncpu = r.cpu_count || 1;
  const cpu = r.cpu_percent === undefined || r.cpu_percent === null ? null : r.cpu_percent;
  bars.appendChild(bar("CPU", cpu === null ? null : cpu / (100 * ncpu),
    cpu === null ? "–" : `${Math.round(cpu)}% of ${ncpu} core${ncpu === 1 ? "" : "s"}`, "kdist-cpu"));
  const pss = r.pss_bytes !== undefined && r.pss_bytes !== null;
  const mem = h("div", "kdist-rss", pss ? `memory ${fmtBytes(r.pss_bytes)} (PSS)` : `RSS ${fmtBytes(r.rss_bytes)}`);
  mem.title = pss ? `proportional set size: pages this process shares with others (a --push's shared memory) `
    + `are split between them, so the ranks' figures add up to what the host holds; RSS ${fmtBytes(r.rss_bytes)}`
    : "resident set size: pages shared with other processes count in each";
  bars.appendChild(mem);
  for (const g of r.gpus || []) {
    bars.appendChild(bar(`GPU${g.index}`, g.util_percent === null ? null : g.util_percent / 100,
      g.util_percent === null ? "–" : `${Math.round(g.util_percent)}%`, "kdist-gpu"));
    bars.appendChild(bar(`mem${g.index}`, g.mem_total_bytes ? g.mem_used_bytes / g.mem_total_bytes : null,
      `${fmtBytes(g.mem_used_bytes)} / ${fmtBytes(g.mem_total_bytes)}`, "kdist-gpumem"));
  }
  for (const t of r.tpus || []) {
    if (t.duty_cycle_percent !== null && t.duty_cycle_percent !== undefined) {
      bars.appendChild(bar(`TPU${t.index}`, t.duty_cycle_percent / 100,
        `${Math.round(t.duty_cycle_percent)}% duty cycle`, "kdist-gpu"));
    }
    bars.appendChild(t.mem_total_bytes
      ? bar(`HBM${t.index}`, t.mem_used_bytes / t.mem_total_bytes,
            `${fmtBytes(t.mem_used_bytes)} / ${fmtBytes(t.mem_total_bytes)}`, "kdist-gpumem")
      : h("div", "kdist-tpu", `TPU${t.index} memory ${fmtBytes(t.mem_used_bytes)}`));
  }
  if (r.split) bars.appendChild(splitBar(r.split, longest));
  if ((r.tpus || []).length && r.tpus[0].source) {
    bars.appendChild(h("div", "kdist-note", `TPU figures: ${r.tpus[0].source}`));
  }
  if (!(r.gpus || []).length && !(r.tpus || []).length && r.accelerator_note) {
    bars.appendChild(h("div", "kdist-note", `accelerator: ${r.accelerator_note}`));
  }
  return bars;
}

// a rank's last loss, its step, its own time per step and its wait for the others
function rankSide(r) {
  const right = h("div", "kdist-rank-loss");
  if (r.loss !== null && r.loss !== undefined) right.appendChild(h("div", null, `loss ${fmtNum(r.loss)}`));
  if (r.step) right.appendChild(h("div", "kdist-where", `step ${r.step}${r.total_steps ? "/" + r.total_steps : ""}`));
  if (r.own_step_s) {
    const ms = v => `${v >= 0.01 ? Math.round(v * 1000) : +(v * 1000).toPrecision(2)} ms`;
    const t = h("div", "kdist-where kdist-own-step",
      `${ms(r.own_step_s)}/step` + (r.wait_step_s >= 0.0005 ? ` · waits ${ms(r.wait_step_s)}` : ""));
    t.title = "this rank's own work per step, and how long it waits per step for the others";
    right.appendChild(t);
  }
  return right;
}

// the charts row: the loss, and one more metric chosen in its selector (kept across updates)
function chartsRow() {
  const row = h("div", "kdist-charts");
  const loss = chartBox(h("div", "kdist-chart-title", "loss"));
  loss.box.classList.add("kdist-chart-loss");
  const sel = h("select", "kdist-metric-select");
  const metric = chartBox(sel);
  metric.box.classList.add("kdist-chart-metric");
  row.append(loss.box, metric.box);
  return { row, loss, metric, sel, optionsKey: "", chosen: null };
}

// the curves: training per step, validation (val_<name>) as points per epoch on <name>'s chart.
// Returns the points drawn and whether any validation is shown.
function drawCurves(c, st, cv, note) {
  const names = cv.names || [];
  const sv = cv.series || {};
  const overlaid = n => n.startsWith("val_") && names.includes(n.slice(4));
  const others = names.filter(n => n !== "loss" && !overlaid(n));
  if (c.chosen === null || !others.includes(c.chosen)) c.chosen = others.find(n => !n.startsWith("val_") && n !== "lr") || others[0] || null;
  let total = c.loss.update("loss", sv.loss, sv.val_loss);
  c.loss.box.style.display = st.idle_note && !total ? "none" : "";  // no empty chart
  note.textContent = total ? (st.curves_note || "") : "";
  c.metric.box.style.display = others.length ? "" : "none";
  if (others.length) {
    if (others.join("\n") !== c.optionsKey) {  // only when the list of metrics changes
      c.optionsKey = others.join("\n");
      c.sel.replaceChildren(...others.map(n => { const o = h("option", null, n); o.value = n; return o; }));
    }
    if (c.sel.value !== c.chosen) c.sel.value = c.chosen;
    total += c.metric.update(c.chosen, sv[c.chosen], c.chosen.startsWith("val_") ? null : sv["val_" + c.chosen]);
  }
  return { total, validation: names.some(overlaid) };
}

// one row per rank / device, the step-split bars scaled to the longest step
function rankTable(ranks) {
  const table = h("div", "kdist-ranks");
  const stepOf = sp => sp ? Object.values(sp).reduce((a, b) => a + (b || 0), 0) : 0;
  const longest = Math.max(0, ...ranks.map(r => stepOf(r.split)));
  for (const r of ranks) table.appendChild(rankRow(r, longest));
  return table;
}

function render({ model, el }) {
  const root = h("div", "kdist-dashboard");
  el.appendChild(root);
  let received = Date.now();
  // Persistent parts: the charts row (with the metric selector) is never detached, so an
  // open selector survives the live updates; `top` and `bottom` are rebuilt on each update.
  const top = h("div", "kdist-top");
  const charts = chartsRow();  // charts.chosen: front-end only (the kernel may be busy)
  const curvesNote = h("div", "kdist-curves-note", "");  // what a point is (words from Python)
  const bottom = h("div", "kdist-bottom");
  root.append(top, charts.row, curvesNote, bottom);
  charts.sel.addEventListener("change", () => { charts.chosen = charts.sel.value; draw(); });

  function draw() {
    const st = model.get("state") || {};
    const status = st.status || "running";
    root.dataset.status = status;
    top.replaceChildren(...headRows(st, status, received), ...progressRows(st, received));
    const drawn = drawCurves(charts, st, curves(), curvesNote);
    root.dataset.points = String(drawn.total);
    const ranks = st.ranks || [];
    bottom.replaceChildren(legend(curves(), ranks, drawn.validation), rankTable(ranks));
    if (st.split_legend) bottom.appendChild(h("div", "kdist-note kdist-split-legend", st.split_legend));
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
  const timer = setInterval(() => {
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
