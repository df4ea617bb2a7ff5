// The benchmarks' results (GET /v1/benchmarks: the JSON files `fathom bench ...` wrote, read-only),
// one file at a time (?file=<path>): every distribution in it (an object with p50 and p99) in a
// table and a chart of its p50, p90 and p99 (log scale), every list of runs (an array of objects
// with numbers) as lines over its first growing figure, and the file itself.
import uPlot from "/console/vendor/uPlot.esm.js";
import { api, el, header, replace, showError, table } from "/console/static/console.js";

const WIDTH = () => Math.min(1000, document.body.clientWidth - 60);
const num = v => typeof v === "number" && Number.isFinite(v);
const colour = i => `hsl(${i * 67 % 360} 60% 45%)`;
const fmt = v => num(v) ? (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3)) : "";

// [path, object] of every object in `x` that `keep` accepts (not looking inside those)
function walk(x, keep, path = "", out = []) {
  if (x && typeof x === "object") {
    if (keep(x)) { out.push([path || "(top)", x]); return out; }
    for (const [k, v] of Object.entries(x)) walk(v, keep, path ? `${path}.${k}` : k, out);
  }
  return out;
}

function distributions(doc) {
  const found = walk(doc, x => !Array.isArray(x) && num(x.p50) && num(x.p99)).slice(0, 60);
  replace("dists", table([
    { title: "#", cell: r => String(r.i + 1) }, { title: "figure", cell: r => r.path }, { title: "n", cell: r => fmt(r.d.n) },
    ...["min", "p50", "p90", "p99", "max"].map(k => ({ title: k, cell: r => fmt(r.d[k]) })),
  ], found.map(([path, d], i) => ({ path, d, i })), "no distributions in this file"));
  const box = document.getElementById("dist-chart");
  box.replaceChildren();
  if (!found.length) return;
  // one column per figure: its p50, p90 and p99 as points on a log scale (figures of different units side by side)
  const positive = v => num(v) && v > 0 ? v : null;
  new uPlot({ width: WIDTH(), height: 260,
    scales: { x: { time: false, range: (u, min, max) => [min - 0.5, max + 0.5] }, y: { distr: 3 } },
    axes: [{ values: (u, ticks) => ticks.map(t => Number.isInteger(t) && found[t] ? String(t + 1) : "") }, { size: 70 }],
    series: [{ label: "figure", value: (u, v) => v === null || !found[v] ? "" : found[v][0] },
      ...["p50", "p90", "p99"].map((k, i) => ({ label: k, stroke: colour(i), paths: () => null,
        points: { show: true, size: 9, fill: colour(i) } }))] },
    [found.map((_, i) => i), ...["p50", "p90", "p99"].map(k => found.map(([, d]) => positive(d[k])))], box);
}

function series(doc) {
  const lists = walk(doc, x => Array.isArray(x) && x.length >= 2 && x.every(r => r && typeof r === "object" && !Array.isArray(r)))
    .slice(0, 8);
  const charts = [];
  for (const [path, rows] of lists) {
    const keys = Object.keys(rows[0]).filter(k => rows.every(r => num(r[k])));
    if (!keys.length) continue;
    const grows = keys.find(k => rows.every((r, i) => i === 0 || r[k] >= rows[i - 1][k]) && rows[0][k] !== rows.at(-1)[k]);
    const ys = keys.filter(k => k !== grows).slice(0, 8);
    if (!ys.length) continue;
    const box = el("div", { class: "series" }, el("h3", {}, path, grows ? ` (over ${grows})` : " (by run)"));
    charts.push(box);
    const x = rows.map((r, i) => grows ? r[grows] : i);
    new uPlot({ width: WIDTH(), height: 240, scales: { x: { time: false } },
      series: [{ label: grows || "run" }, ...ys.map((k, i) => ({ label: k, stroke: colour(i) }))] },
      [x, ...ys.map(k => rows.map(r => r[k]))], box);
  }
  replace("series", charts.length ? charts : el("p", { class: "empty" }, "no lists of runs in this file"));
}

async function show(path) {
  const doc = await api("/benchmarks/" + path.split("/").map(encodeURIComponent).join("/"));
  replace("title", path);
  const said = ["benchmark", "command", "busy_machine", "started", "elapsed_s"].filter(k => doc[k] !== undefined);
  replace("summary", table([{ title: "", cell: k => k }, { title: "", cell: k => typeof doc[k] === "string" ? doc[k] : JSON.stringify(doc[k]) }],
    said, ""));
  distributions(doc);
  series(doc);
  document.getElementById("raw").textContent = JSON.stringify(doc, null, 1);
}

header().then(async () => {
  const files = await api("/benchmarks");
  const chosen = new URLSearchParams(location.search).get("file");
  replace("files", files.length ? el("ul", { class: "files" }, files.map(f => el("li", {},
    el("a", { href: "/console/benchmarks?file=" + encodeURIComponent(f.path), class: f.path === chosen ? "chosen" : "" }, f.path),
    ` (${(f.bytes / 1024).toFixed(1)} KiB)`))) : el("p", { class: "empty" }, "no results files (FATHOM_BENCHMARKS_DIR)"));
  if (chosen) await show(chosen);
}).catch(showError);
