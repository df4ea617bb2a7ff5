// The topology: nodes (admin), fabric switches and their LLDP links, tunnels, and the networks,
// routers, ports and port chains the token may see; redrawn after each change notice.
import cytoscape from "/console/vendor/cytoscape.esm.min.mjs";
import { api, apiMaybe, el, follow, header, replace, showError, statusBadge, table } from "/console/static/console.js";

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
    { selector: "edge.tunnel", style: { "line-style": "dashed", "line-color": "#7d8fa3" } },
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
    ["/networks", "/routers", "/ports", "/sfc/port_chains"].map(p => api(p)));
  let nodes = [], agents = [], switches = [], flows = {};
  if (me.admin) {
    [nodes, agents, switches] = await Promise.all(["/nodes", "/agents", "/fabric/switches"].map(p => api(p)));
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

function draw({ nodes, switches, tunnels, networks, routers, ports, flows }) {
  const els = [];
  const state = o => o.status === "error" ? "bad" : o.status === "pending" ? "pending" : "";
  const hosts = new Set(nodes.map(n => n.name));
  ports.forEach(p => { if (p.node && !hosts.has(p.node)) { hosts.add(p.node); nodes.push({ name: p.node }); } });
  nodes.forEach(n => els.push({ data: { id: "host:" + n.name, label: n.name }, classes: "host " + (flows[n.name] && !flows[n.name].in_sync ? "bad" : "") }));
  switches.forEach(s => {
    els.push({ data: { id: "switch:" + s.id, label: s.name }, classes: "switch " + state(s) });
    Object.keys(linksOf(s)).forEach(k => {
      const node = k.split(" → ")[1];
      if (hosts.has(node)) els.push({ data: { id: `link:${s.id}:${k}`, source: "switch:" + s.id, target: "host:" + node }, classes: "link" });
    });
  });
  tunnels.forEach(([a, b]) => els.push({ data: { id: `tunnel:${a.name}:${b.name}`, source: "host:" + a.name, target: "host:" + b.name }, classes: "tunnel" }));
  networks.forEach(n => els.push({ data: { id: "network:" + n.id, label: n.name }, classes: "network " + state(n) }));
  routers.forEach(r => els.push({ data: { id: "router:" + r.id, label: `${r.name} (${r.mode})` }, classes: "router " + state(r) }));
  const netIds = new Set(networks.map(n => n.id)), routerIds = new Set(routers.map(r => r.id));
  ports.forEach(p => {
    if (p.router_id !== null && routerIds.has(p.router_id)) {
      if (netIds.has(p.network_id)) els.push({ data: { id: "rif:" + p.id, source: "router:" + p.router_id, target: "network:" + p.network_id } });
      return;
    }
    els.push({ data: { id: "port:" + p.id, label: p.name, parent: p.node ? "host:" + p.node : undefined }, classes: "port " + state(p) });
    if (netIds.has(p.network_id)) els.push({ data: { id: "pnet:" + p.id, source: "port:" + p.id, target: "network:" + p.network_id } });
  });
  cy.batch(() => { cy.elements().remove(); cy.add(els); });
  cy.layout({ name: "cose", animate: false, randomize: true, nodeDimensionsIncludeLabels: true, padding: 20,
              idealEdgeLength: () => 60, nodeRepulsion: () => 20000, componentSpacing: 60 }).run();
}

header().then(who => { me = who; follow(refresh); }).catch(showError);
