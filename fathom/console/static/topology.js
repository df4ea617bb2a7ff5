// The topology: nodes (admin), fabric switches and their LLDP links, tunnels, and the networks,
// routers, ports and port chains the token may see; redrawn after each change notice.
import cytoscape from "/console/vendor/cytoscape.esm.min.mjs";
import { api, apiList, apiMaybe, el, follow, header, replace, showError, statusBadge, table } from "/console/static/console.js";

const cy = cytoscape({
  container: document.getElementById("graph"),
  style: [
    { selector: "node", style: { label: "data(label)", "font-size": 12, "text-valign": "bottom", "background-color": "#8aa4c0" } },
    { selector: "node.host", style: { shape: "round-rectangle", "background-opacity": 0.08, "text-valign": "top", "border-width": 1,
                                    "min-width": 60, "min-height": 40, "font-weight": "bold" } },
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

// a fabric switch's links, one per (port, node), with how each is known (declared, lldp)
function linksOf(s) {
  const out = {};
  s.links.forEach(l => { (out[`${l.port_name} → ${l.node}`] ||= new Set()).add(l.source); });
  return out;
}

const portLink = p => el("a", { href: "/console/port/" + p.id }, p.name || "port " + p.id);
let me;

async function refresh() {
  const [networks, routers, ports, chains] = await Promise.all(
    ["/networks", "/routers", "/ports", "/sfc/port_chains"].map(p => apiList(p)));
  let nodes = [], agents = [], switches = [], flows = {};
  if (me.admin) {
    [nodes, agents, switches] = await Promise.all([apiList("/nodes"), api("/agents"), apiList("/fabric/switches")]);
    const answers = await Promise.all(nodes.map(n => apiMaybe("/nodes/" + encodeURIComponent(n.name) + "/flows")));
    nodes.forEach((n, i) => { flows[n.name] = answers[i]; });
  }
  const agentOf = Object.fromEntries(agents.map(a => [a.node, a]));
  const netName = Object.fromEntries(networks.map(n => [n.id, n.name]));
  const count = byStage => byStage ? Object.values(byStage).reduce((s, l) => s + l.length, 0) : null;
  const tunnels = [];
  const tunnelled = nodes.filter(n => n.tunnel_ip);
  tunnelled.forEach((a, i) => tunnelled.slice(i + 1).forEach(b => tunnels.push([a, b])));

  if (me.admin) {
    replace("nodes", table([
      { title: "node", cell: n => n.name }, { title: "role", cell: n => n.role },
      { title: "tunnel address", cell: n => n.tunnel_ip || "" },
      { title: "switch", cell: n => statusBadge(flows[n.name] && flows[n.name].connected ? "up" : "down") },
      { title: "bridges (OVSDB)", cell: n => statusBadge(n.state === "complete" ? "ok" : n.state, n.status_reason) },
      { title: "agent", cell: n => statusBadge((agentOf[n.name] || {}).state === "up" ? "up" : "down", (agentOf[n.name] || {}).state) },
      { title: "in sync", cell: n => statusBadge(flows[n.name] && flows[n.name].in_sync ? "yes" : "no") },
      { title: "flows desired / actual", cell: n => flows[n.name] ? `${count(flows[n.name].desired)} / ${count(flows[n.name].actual) ?? "—"}` : "" },
      { title: "status", cell: n => statusBadge(n.status, n.status_reason) },
    ], nodes));
    replace("switches", table([
      { title: "fabric switch", cell: s => s.name }, { title: "address", cell: s => s.management_ip },
      { title: "links (port → node, how known)", cell: s => Object.entries(linksOf(s)).map(([k, how]) => `${k} (${[...how].join(", ")})`).join("; ") },
      { title: "status", cell: s => statusBadge(s.status, s.status_reason) },
    ], switches));
    replace("tunnels", table([
      { title: "between", cell: t => `${t[0].name} ↔ ${t[1].name}` },
      { title: "addresses", cell: t => `${t[0].tunnel_ip} ↔ ${t[1].tunnel_ip}` },
      { title: "both switches up", cell: t => statusBadge(t.every(n => flows[n.name] && flows[n.name].connected) ? "yes" : "no") },
    ], tunnels));
  } else {
    document.getElementById("infra-section").hidden = true;
  }
  replace("networks", table([
    { title: "network", cell: n => n.name }, { title: "project", cell: n => n.project_id },
    { title: "type", cell: n => `${n.type} ${n.segmentation_id ?? ""}` }, { title: "status", cell: n => statusBadge(n.status, n.status_reason) },
  ], networks));
  replace("routers", table([
    { title: "router", cell: r => r.name }, { title: "project", cell: r => r.project_id },
    { title: "mode", cell: r => r.mode + (r.gateway_node ? ` (${r.gateway_node})` : "") },
    { title: "status", cell: r => statusBadge(r.status, r.status_reason) },
  ], routers));
  replace("ports", table([
    { title: "port", cell: portLink }, { title: "project", cell: p => p.project_id },
    { title: "network", cell: p => netName[p.network_id] ?? p.network_id },
    { title: "addresses", cell: p => p.fixed_ips.map(f => f.ip_address).join(", ") + " " + p.mac_address },
    { title: "node", cell: p => p.node || "" }, { title: "status", cell: p => statusBadge(p.status, p.status_reason) },
  ], ports));
  replace("chains", table([
    { title: "port chain", cell: c => el("a", { href: "/console/chain/" + c.id }, c.name || "chain " + c.id) },
    { title: "project", cell: c => c.project_id }, { title: "PPTMon", cell: c => c.pptmon ? "on" : "off" },
  ], chains));
  draw({ nodes, switches, tunnels, networks, routers, ports, flows });
}

// A fixed layout, so that the picture reads the same after each change: networks in a row at the
// top (routers above the networks they join), each node a box below holding its ports, unbound
// ports between, fabric switches at the bottom.
const COL = 180, ROW = 46;

function draw({ nodes, switches, tunnels, networks, routers, ports, flows }) {
  const els = [];
  const state = o => o.status === "error" ? "bad" : o.status === "pending" ? "pending" : "";
  const hosts = nodes.map(n => n.name);
  ports.forEach(p => { if (p.node && !hosts.includes(p.node)) hosts.push(p.node); });
  const routerIds = new Set(routers.map(r => r.id)), netIds = new Set(networks.map(n => n.id));
  const vmPorts = ports.filter(p => !(p.router_id !== null && routerIds.has(p.router_id)));
  const width = Math.max(hosts.length, networks.length, 1) * COL;
  const spread = (i, n) => (i + 0.5) * width / Math.max(n, 1);
  const netX = {};
  networks.forEach((n, i) => {
    netX[n.id] = spread(i, networks.length);
    els.push({ data: { id: "network:" + n.id, label: n.name }, classes: "network " + state(n), position: { x: netX[n.id], y: 60 } });
  });
  routers.forEach((r, i) => {
    const joined = ports.filter(p => p.router_id === r.id && netIds.has(p.network_id)).map(p => netX[p.network_id]);
    const x = joined.length ? joined.reduce((a, b) => a + b, 0) / joined.length : spread(i, routers.length);
    els.push({ data: { id: "router:" + r.id, label: `${r.name} (${r.mode})` }, classes: "router " + state(r), position: { x, y: -20 } });
  });
  const unbound = vmPorts.filter(p => !p.node);
  unbound.forEach((p, i) => { p._pos = { x: spread(i, unbound.length), y: 150 }; });
  hosts.forEach((h, i) => {
    const x = spread(i, hosts.length);
    vmPorts.filter(p => p.node === h).forEach((p, j) => { p._pos = { x: x + (j % 2 ? 35 : -35), y: 260 + Math.floor(j / 2) * ROW }; });
    els.push({ data: { id: "host:" + h, label: h }, classes: "host " + (flows[h] && !flows[h].in_sync ? "bad" : ""), position: { x, y: 260 } });
  });
  const deepest = Math.max(260, ...vmPorts.filter(p => p._pos).map(p => p._pos.y));
  switches.forEach((s, i) => {
    els.push({ data: { id: "switch:" + s.id, label: s.name }, classes: "switch " + state(s), position: { x: spread(i, switches.length), y: deepest + 110 } });
    Object.keys(linksOf(s)).forEach(k => {
      const node = k.split(" → ")[1];
      if (hosts.includes(node)) els.push({ data: { id: `link:${s.id}:${k}`, source: "switch:" + s.id, target: "host:" + node }, classes: "link" });
    });
  });
  tunnels.forEach(([a, b]) => els.push({ data: { id: `tunnel:${a.name}:${b.name}`, source: "host:" + a.name, target: "host:" + b.name }, classes: "tunnel" }));
  ports.forEach(p => {
    if (p.router_id !== null && routerIds.has(p.router_id)) {
      if (netIds.has(p.network_id)) els.push({ data: { id: "rif:" + p.id, source: "router:" + p.router_id, target: "network:" + p.network_id } });
      return;
    }
    els.push({ data: { id: "port:" + p.id, label: p.name, parent: p.node ? "host:" + p.node : undefined }, classes: "port " + state(p), position: p._pos });
    if (netIds.has(p.network_id)) els.push({ data: { id: "pnet:" + p.id, source: "port:" + p.id, target: "network:" + p.network_id } });
  });
  cy.batch(() => { cy.elements().remove(); cy.add(els); });
  cy.fit(undefined, 30);
}

header().then(who => { me = who; follow(refresh); }).catch(showError);
