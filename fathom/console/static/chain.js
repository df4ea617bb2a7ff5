// A port chain: its groups hop by hop, each port pair (VNF) with its node and PPTMon's p50/p99 over
// the last 10 s, and a chart of end-to-end and per-group p50 and p99 that gains a point every 2 s.
import uPlot from "/console/vendor/uPlot.esm.js";
import { api, el, follow, header, replace, showError } from "/console/static/console.js";

const chainId = Number(location.pathname.split("/").pop());
const POINTS = 300;          // the chart keeps the last POINTS samples (10 minutes)
const us = s => s && s.count ? `${s.p50_us.toFixed(1)} / ${s.p99_us.toFixed(1)} µs` : "no records";
let plot = null, series = [], data = [[]];

async function refreshChain() {
  const chain = await api("/sfc/port_chains/" + chainId);
  replace("title", "Port chain ", el("span", {}, chain.name), " ", chain.pptmon ? "(PPTMon on)" : "(PPTMon off)");
  replace("chain", el("p", {}, `project ${chain.project_id}; groups ${chain.port_pair_groups.length}; classifiers ${chain.flow_classifiers.length}`));
  await sample();
}

async function sample() {
  const s = await api(`/sfc/port_chains/${chainId}/pptmon?window=10s`);
  const hops = [el("div", { class: "hop" }, "classifier")];
  s.groups.forEach(g => {
    hops.push(el("span", { class: "arrow" }, "→"));
    hops.push(el("div", { class: "hop" }, el("strong", {}, g.name || "group " + g.id), el("div", {}, "p50 / p99 ", us(g.processing)),
      g.port_pairs.map(p => el("div", {}, `${p.name || "pair " + p.id} on ${p.node || "(unbound)"}: ${us(p.processing)}`))));
  });
  hops.push(el("span", { class: "arrow" }, "→"), el("div", { class: "hop" }, "end to end ", us(s.e2e)));
  replace("hops", hops);
  replace("records", `${s.records} records in the last 10 s` + (s.warnings.length ? "; " + s.warnings.join("; ") : ""));
  chart(s);
}

function chart(s) {
  const names = [["end to end", s.e2e], ...s.groups.map(g => [g.name || "group " + g.id, g.processing])];
  const labels = names.flatMap(([n]) => [n + " p50", n + " p99"]);
  if (!plot || labels.join() !== series.join()) {
    series = labels;
    data = [[], ...labels.map(() => [])];
    if (plot) plot.destroy();
    plot = new uPlot({ width: Math.min(1000, document.body.clientWidth - 60), height: 300,
      series: [{}, ...labels.map((l, i) => ({ label: l, stroke: `hsl(${(i >> 1) * 67 % 360} 60% ${i % 2 ? 35 : 55}%)`, dash: i % 2 ? [4, 4] : undefined }))],
      axes: [{}, { label: "µs" }] }, data, document.getElementById("chart"));
  }
  data[0].push(Date.now() / 1000);
  names.forEach(([, st], i) => {
    data[1 + 2 * i].push(st && st.count ? st.p50_us : null);
    data[2 + 2 * i].push(st && st.count ? st.p99_us : null);
  });
  if (data[0].length > POINTS) data.forEach(d => d.shift());
  plot.setData(data);
  // the points with a time end to end, on the chart's box (what a reader or a test can count)
  document.getElementById("chart").dataset.timed = data[1].filter(v => v !== null).length;
}

header().then(() => {
  follow(refreshChain, ({ changes }) => changes.some(c => ["port_chain", "port_pair_group", "port_pair",
                                                         "flow_classifier", "port"].includes(c.kind)));
  setInterval(() => sample().catch(showError), 2000);
}).catch(showError);
