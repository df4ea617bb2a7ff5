// The topology: nodes (admin: with their health) and the caller's ports counted per node
// (GET /v1/topology), fabric switches and their LLDP links, tunnels, and the networks, routers and
// port chains the token may see. Ports are listed for one node at a time (?node=<name>, a link to
// share), or all of them while the caller sees at most INLINE_PORTS. Networks and routers are
// listed and drawn whole while the caller has at most INLINE_OBJECTS of each (the summary counts
// them by status); beyond, the page shows their counts and one page of PAGE of them at a time (next,
// previous, or a name looked up), and reads only that page. Live: each change notice's
// objects are put in place (a port's `was` and `now` move it between the counts) and the page drawn
// again; nothing is read again but after a reconnect or a `refresh` notice.
import cytoscape from "/console/vendor/cytoscape.esm.min.mjs";
import { api, apiList, el, follow, header, replace, showError, statusBadge, table } from "/console/static/console.js";

const INLINE_PORTS = 500;     // ports listed without opening a node
const INLINE_OBJECTS = 200;   // networks (routers) listed and drawn whole; more: counted, a page at a time
const PAGE = 50;
const DRAWN_TUNNELS = 12;     // nodes up to which every tunnel is drawn (a full mesh: n(n-1)/2 lines)
const opened = new URLSearchParams(location.search).get("node");

const cy = cytoscape({
  container: document.getElementById("graph"),
  style: [
    { selector: "node", style: { label: "data(label)", "font-size": 12, "text-valign": "bottom", "background-color": "#8aa4c0",
                                "text-wrap": "wrap" } },
    { selector: "node.host", style: { shape: "round-rectangle", "background-opacity": 0.08, "text-valign": "top", "border-width": 1,
                                    "min-width": 60, "min-height": 40, "font-weight": "bold" } },
    { selector: "node.host:childless", style: { "text-valign": "center", width: 110, height: 40, "font-size": 10 } },
    { selector: "node.switch", style: { shape: "rectangle", "background-color": "#5b6b7c" } },
    { selector: "node.network", style: { shape: "ellipse", "background-color": "#4c9be8" } },
    { selector: "node.router", style: { shape: "diamond", "background-color": "#e8a24c" } },
    { selector: "node.port", style: { width: 16, height: 16, "background-color": "#6cc070" } },
    { selector: "node.bad", style: { "border-width": 3, "border-color": "#d33" } },
    { selector: "node.pending", style: { "border-width": 3, "border-color": "#e0b000" } },
    { selector: "edge", style: { width: 1.5, "line-color": "#b6c2cf", "curve-style": "bezier" } },
    { selector: "edge.tunnel", style: { "line-style": "dashed", "line-color": "#7d8fa3", "curve-style": "unbundled-bezier", "control-point-distances": [40], "control-point-weights": [0.5] } },
    { selector: "edge.link", style: { width: 3, "line-color": "#5b6b7c" } },
  ],
  wheelSensitivity: 0.3,
});
cy.on("tap", "node.port", ev => { location.href = "/console/port/" + ev.target.data("id").slice(5); });
cy.on("tap", "node.host", ev => { location.href = nodeLink(ev.target.data("id").slice(5)); });

const nodeLink = name => "/console/topology?node=" + encodeURIComponent(name);

// a fabric switch's links, one per (port, node), with how each is known (declared, lldp)
function linksOf(s) {
  const out = {};
  s.links.forEach(l => { (out[`${l.port_name} → ${l.node}`] ||= new Set()).add(l.source); });
  return out;
}

const portLink = p => el("a", { href: "/console/port/" + p.id }, p.name || "port " + p.id);
const total = counts => Object.values(counts).reduce((a, b) => a + b, 0);
const countText = counts => Object.entries(counts).sort().map(([s, n]) => `${n} ${s}`).join(", ");
const byId = list => new Map(list.map(o => [o.id, o]));

let me;
// what the page shows: objects by id (nodes by name), the caller's port counts per node
const view = { seq: 0, nodes: new Map(), counts: new Map(), unbound: {}, switches: new Map(), networks: new Map(),
               routers: new Map(), chains: new Map(), ports: new Map(), listing: false, totals: {} };

// networks and routers: each listed whole, or (`paged`) one page: after `marker` (stack: the pages before), or `name`
const lists = { networks: { path: "/networks", paged: false, markers: [], name: "" },
                routers: { path: "/routers", paged: false, markers: [], name: "" } };

async function readList(field, counts) {
  const l = lists[field];
  l.paged = total(counts) > INLINE_OBJECTS;
  if (!l.paged) { l.markers = []; l.name = ""; return apiList(l.path); }
  const marker = l.markers[l.markers.length - 1];
  return api(`${l.path}?limit=${PAGE}` + (l.name ? "&name=" + encodeURIComponent(l.name) : "") + (marker ? "&marker=" + marker : ""));
}

async function load() {
  const summary = await api("/topology");
  const [networks, routers, chains] = await Promise.all([
    readList("networks", summary.networks), readList("routers", summary.routers), apiList("/sfc/port_chains")]);
  const switches = me.admin ? await apiList("/fabric/switches") : [];
  view.seq = summary.seq;
  view.nodes = new Map(summary.nodes.map(n => [n.name, n]));
  view.counts = new Map(summary.nodes.map(n => [n.name, { ...n.ports }]));
  view.unbound = { ...summary.unbound_ports };
  view.totals = { networks: summary.networks, routers: summary.routers };
  view.switches = byId(switches); view.networks = byId(networks); view.routers = byId(routers); view.chains = byId(chains);
  const seen = [...view.counts.values(), view.unbound].reduce((s, c) => s + total(c), 0);
  view.listing = opened !== null || seen <= INLINE_PORTS;
  view.ports = byId(!view.listing ? [] : await apiList(opened !== null ? "/ports?node=" + encodeURIComponent(opened) : "/ports"));
}

// Another page of a paged list (`to`: "next", "previous", or a name; "" the first page): read, drawn.
async function turn(field, to) {
  const l = lists[field], shown = [...view[field].keys()];
  if (to === "next") { if (shown.length < PAGE) return; l.markers.push(Math.max(...shown)); }
  else if (to === "previous") l.markers.pop();
  else { l.markers = []; l.name = to; }
  try { view[field] = byId(await readList(field, view.totals[field])); showError(null); } catch (e) { showError(e); }
  soon();
}

// A paged list's counts changed (a notice of one of them): the summary read again, once for the notices of 2 s.
let recount = null;
function recountSoon() {
  recount ||= setTimeout(async () => {
    recount = null;
    try { const s = await api("/topology"); view.totals = { networks: s.networks, routers: s.routers }; soon(); }
    catch (e) { showError(e); }
  }, 2000);
}

// whether the ports table lists this port
const listed = p => view.listing && (opened === null || p.node === opened);

// A change notice put in place: objects replaced or removed by id; a port's counts moved from where
// it was to where it is, unless the summary read was of that pass or later (it counts it already).
const MAPS = { network: "networks", router: "routers", port_chain: "chains", fabric_switch: "switches" };
function apply({ seq, changes }) {
  const count = (place, by) => {
    if (!place || seq <= view.seq) return;
    const counts = place.node ? (view.counts.get(place.node) || view.counts.set(place.node, {}).get(place.node)) : view.unbound;
    counts[place.status] = (counts[place.status] || 0) + by;
    if (counts[place.status] <= 0) delete counts[place.status];
  };
  for (const c of changes) {
    if (c.kind === "port") {
      count(c.was, -1); count(c.now, +1);
      if (c.object && listed(c.object)) view.ports.set(c.id, c.object); else view.ports.delete(c.id);
    } else if (c.kind === "node") {
      for (const [name, n] of view.nodes) if (n.id === c.id) view.nodes.delete(name);
      if (c.object) view.nodes.set(c.object.name, c.object);
    } else if (MAPS[c.kind]) {
      const field = MAPS[c.kind], l = lists[field];
      if (l && l.paged) {     // the page shown keeps its objects (edited or gone in place); the counts are read again
        if (view[field].has(c.id)) { if (c.object) view[field].set(c.id, c.object); else view[field].delete(c.id); }
        recountSoon();
      } else if (c.object) view[field].set(c.id, c.object); else view[field].delete(c.id);
    }
  }
  soon();
  return false;
}

// drawn once for the notices that come in one frame
let drawing = false;
function soon() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => { drawing = false; try { render(); } catch (e) { showError(e); } });
}

function render() {
  const nodes = [...view.nodes.values()], switches = [...view.switches.values()], networks = [...view.networks.values()];
  const routers = [...view.routers.values()], ports = [...view.ports.values()].filter(listed);
  const workloads = ports.filter(p => p.router_id === null);    // router interfaces: a router's lines
  const tunnelled = me.admin ? nodes.filter(n => n.tunnel_ip) : [];
  const tunnels = [];
  if (tunnelled.length <= DRAWN_TUNNELS) tunnelled.forEach((a, i) => tunnelled.slice(i + 1).forEach(b => tunnels.push([a, b])));
  const up = n => n.switch === "ok";

  if (me.admin) {
    replace("nodes", table([
      { title: "node", cell: n => el("a", { href: nodeLink(n.name) }, n.name) }, { title: "role", cell: n => n.role },
      { title: "tunnel address", cell: n => n.tunnel_ip || "" },
      { title: "switch", cell: n => statusBadge(up(n) ? "up" : "down", n.switch) },
      { title: "bridges (OVSDB)", cell: n => statusBadge(n.state === "complete" ? "ok" : n.state) },
      { title: "agent", cell: n => statusBadge(n.agent === "up" ? "up" : "down", n.agent) },
      { title: "in sync", cell: n => statusBadge(n.in_sync ? "yes" : "no") },
      { title: "flows desired / actual", cell: n => `${n.flows_desired} / ${n.flows_actual ?? "—"}` },
      { title: "status", cell: n => statusBadge(n.status, n.status_reason) },
    ], nodes));
    replace("switches", table([
      { title: "fabric switch", cell: s => s.name }, { title: "address", cell: s => s.management_ip },
      { title: "links (port → node, how known)", cell: s => Object.entries(linksOf(s)).map(([k, how]) => `${k} (${[...how].join(", ")})`).join("; ") },
      { title: "status", cell: s => statusBadge(s.status, s.status_reason) },
    ], switches));
    replace("tunnels", tunnelled.length > DRAWN_TUNNELS
      ? el("p", {}, `a full mesh between the ${tunnelled.length} nodes with a tunnel address (their addresses: the nodes' table)`)
      : table([
        { title: "between", cell: t => `${t[0].name} ↔ ${t[1].name}` },
        { title: "addresses", cell: t => `${t[0].tunnel_ip} ↔ ${t[1].tunnel_ip}` },
        { title: "both switches up", cell: t => statusBadge(t.every(up) ? "yes" : "no") },
      ], tunnels));
  } else {
    document.getElementById("infra-section").hidden = true;
  }
  const counted = [...view.counts.entries()].filter(([, c]) => total(c));
  if (total(view.unbound)) counted.push([null, view.unbound]);
  replace("port-counts", table([
    { title: "node", cell: ([name]) => name === null ? "(no node)" : el("a", { href: nodeLink(name) }, name) },
    { title: "ports", cell: ([, c]) => String(total(c)) }, { title: "by status", cell: ([, c]) => countText(c) },
  ], counted));
  pager("networks", "networks", networks.length);
  pager("routers", "routers", routers.length);
  replace("networks", table([
    { title: "network", cell: n => n.name }, { title: "project", cell: n => n.project_id },
    { title: "type", cell: n => `${n.type} ${n.segmentation_id ?? ""}` }, { title: "status", cell: n => statusBadge(n.status, n.status_reason) },
  ], networks));
  replace("routers", table([
    { title: "router", cell: r => r.name }, { title: "project", cell: r => r.project_id },
    { title: "mode", cell: r => r.mode + (r.gateway_node ? ` (${r.gateway_node})` : "") },
    { title: "status", cell: r => statusBadge(r.status, r.status_reason) },
  ], routers));
  replace("ports-title", opened !== null ? ["Ports on ", el("span", {}, opened), " ", el("a", { href: "/console/topology" }, "(all nodes)")] : "Ports");
  const netName = id => (view.networks.get(id) || {}).name ?? id;
  replace("ports", view.listing ? table([
    { title: "port", cell: portLink }, { title: "project", cell: p => p.project_id },
    { title: "network", cell: p => netName(p.network_id) },
    { title: "addresses", cell: p => p.fixed_ips.map(f => f.ip_address).join(", ") + " " + p.mac_address },
    { title: "node", cell: p => p.node || "" }, { title: "status", cell: p => statusBadge(p.status, p.status_reason) },
  ], ports) : el("p", { class: "empty" }, "open a node (in the graph or the ports per node) to list its ports"));
  replace("chains", table([
    { title: "port chain", cell: c => el("a", { href: "/console/chain/" + c.id }, c.name || "chain " + c.id) },
    { title: "project", cell: c => c.project_id }, { title: "PPTMon", cell: c => c.pptmon ? "on" : "off" },
  ], [...view.chains.values()]));
  draw({ nodes, switches, tunnels, networks, routers, ports: workloads });
}

// A paged list's bar: its counts by status, which of them are shown, and the controls to page or look one up.
function pager(field, noun, shown) {
  const l = lists[field], bar = document.getElementById(field + "-bar");
  bar.hidden = !l.paged;
  if (l.form) l.form.hidden = !l.paged;
  if (!l.paged) return;
  const first = l.markers.length * PAGE;
  replace(field + "-bar", el("span", { class: "counts" }, `${total(view.totals[field])} ${noun} (${countText(view.totals[field])}); ` +
    (l.name ? `named ${l.name}: ${shown}` : shown ? `showing ${first + 1}–${first + shown}` : "none on this page")));
  if (!l.form) {    // made once: a redraw keeps what is typed
    const input = el("input", { type: "search", placeholder: "a name (none: every one)", "aria-label": `look up ${noun} by name` });
    const form = el("form", {}, input, el("button", { type: "submit" }, "look up"),
      el("button", { type: "button", "data-to": "previous" }, "previous"), el("button", { type: "button", "data-to": "next" }, "next"));
    form.addEventListener("submit", e => { e.preventDefault(); turn(field, input.value.trim()); });
    form.addEventListener("click", e => { if (e.target.dataset.to) turn(field, e.target.dataset.to); });
    bar.parentNode.insertBefore(form, bar.nextSibling);
    l.form = form;
  }
  l.form.querySelector("[data-to=previous]").disabled = !l.markers.length || !!l.name;
  l.form.querySelector("[data-to=next]").disabled = shown < PAGE || !!l.name;
}

// A fixed layout, so that the picture reads the same after each change: networks in a row at the
// top (routers above the networks they join), each node a box below holding its listed ports (or
// its counts), unbound ports between, fabric switches at the bottom.
const COL = 180, ROW = 46;

function draw({ nodes, switches, tunnels, networks, routers, ports }) {
  const els = [];
  const state = o => o.status === "error" ? "bad" : o.status === "pending" ? "pending" : "";
  const hosts = nodes.map(n => n.name);
  [...view.counts.keys()].forEach(h => { if (!hosts.includes(h)) hosts.push(h); });
  ports.forEach(p => { if (p.node && !hosts.includes(p.node)) hosts.push(p.node); });
  const netIds = new Set(networks.map(n => n.id));
  const width = Math.max(hosts.length, networks.length, 1) * COL;
  const spread = (i, n) => (i + 0.5) * width / Math.max(n, 1);
  const netX = {};
  networks.forEach((n, i) => {
    netX[n.id] = spread(i, networks.length);
    els.push({ data: { id: "network:" + n.id, label: n.name }, classes: "network " + state(n), position: { x: netX[n.id], y: 60 } });
  });
  routers.forEach((r, i) => {
    const joined = r.interfaces.filter(f => netIds.has(f.network_id)).map(f => netX[f.network_id]);
    const x = joined.length ? joined.reduce((a, b) => a + b, 0) / joined.length : spread(i, routers.length);
    els.push({ data: { id: "router:" + r.id, label: `${r.name} (${r.mode})` }, classes: "router " + state(r), position: { x, y: -20 } });
    r.interfaces.forEach(f => {
      if (netIds.has(f.network_id)) els.push({ data: { id: "rif:" + f.id, source: "router:" + r.id, target: "network:" + f.network_id } });
    });
  });
  const unbound = ports.filter(p => !p.node);
  unbound.forEach((p, i) => { p._pos = { x: spread(i, unbound.length), y: 150 }; });
  const info = new Map(nodes.map(n => [n.name, n]));
  hosts.forEach((h, i) => {
    const x = spread(i, hosts.length), n = info.get(h) || {}, counts = view.counts.get(h) || {};
    ports.filter(p => p.node === h).forEach((p, j) => { p._pos = { x: x + (j % 2 ? 35 : -35), y: 260 + Math.floor(j / 2) * ROW }; });
    const bad = n.in_sync === false || n.status === "error";
    els.push({ data: { id: "host:" + h, label: total(counts) ? `${h}\n${countText(counts)}` : h },
               classes: "host " + (bad ? "bad" : ""), position: { x, y: 260 } });
  });
  const deepest = Math.max(260, ...ports.filter(p => p._pos).map(p => p._pos.y));
  switches.forEach((s, i) => {
    els.push({ data: { id: "switch:" + s.id, label: s.name }, classes: "switch " + state(s), position: { x: spread(i, switches.length), y: deepest + 110 } });
    Object.keys(linksOf(s)).forEach(k => {
      const node = k.split(" → ")[1];
      if (hosts.includes(node)) els.push({ data: { id: `link:${s.id}:${k}`, source: "switch:" + s.id, target: "host:" + node }, classes: "link" });
    });
  });
  tunnels.forEach(([a, b]) => els.push({ data: { id: `tunnel:${a.name}:${b.name}`, source: "host:" + a.name, target: "host:" + b.name }, classes: "tunnel" }));
  ports.forEach(p => {
    els.push({ data: { id: "port:" + p.id, label: p.name, parent: p.node ? "host:" + p.node : undefined }, classes: "port " + state(p), position: p._pos });
    if (netIds.has(p.network_id)) els.push({ data: { id: "pnet:" + p.id, source: "port:" + p.id, target: "network:" + p.network_id } });
  });
  cy.batch(() => { cy.elements().remove(); cy.add(els); });
  cy.fit(undefined, 30);
  // what the picture accounts for (the benchmark waits for it)
  document.getElementById("graph").dataset.ports = [...view.counts.values(), view.unbound].reduce((s, c) => s + total(c), 0);
}

header().then(who => { me = who; follow(async () => { await load(); render(); }, apply); }).catch(showError);
