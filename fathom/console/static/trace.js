// One packet's path (POST /v1/traces): the verdict, the path as the API draws it (?format=svg) and
// every hop's stages with the flow that matched and its owner. The form is a GET of this page, so
// a trace is a URL to share: ?port=<id>&to=<IPv4 or port name>&proto=&dport=&actual=1.
import { api, el, header, replace, showError, table } from "/console/static/console.js";

const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;
const q = new URLSearchParams(location.search);

function owner(o) {
  if (!o) return "";
  return o.kind === "stage" ? o.name : `${o.kind} ${o.name || o.id}`;
}

// The SVG the API drew, parsed as XML (not HTML) and put in the page as an <svg> element; a
// script or foreign HTML in it would be removed (the API escapes every name, and the CSP runs no
// inline script either).
function picture(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const root = doc.documentElement;
  if (root.namespaceURI !== "http://www.w3.org/2000/svg" || root.localName !== "svg")
    return el("p", { class: "empty" }, "the picture could not be read");
  root.querySelectorAll("script, foreignObject").forEach(e => e.remove());
  return document.importNode(root, true);
}

async function run(ports) {
  const portId = Number(q.get("port")), to = (q.get("to") || "").trim();
  if (!portId || !to) return;
  const body = { port_id: portId, proto: q.get("proto") || "icmp" };
  if (IPV4.test(to)) body.to_ip = to;
  else {
    const dst = ports.find(p => p.name === to);
    if (!dst) throw new Error(`no port named ${to} (give an IPv4 address or the name of a port you may see)`);
    body.to_port_id = dst.id;
  }
  if (body.proto !== "icmp") body.dport = Number(q.get("dport")) || undefined;
  if (q.get("actual")) body.actual = true;
  replace("verdict", el("p", { class: "empty" }, "tracing…"));
  const [result, svg] = await Promise.all([
    api("/traces", { method: "POST", body }),
    api("/traces?format=svg", { method: "POST", body, text: true }),
  ]);
  const v = result.verdict;
  replace("verdict", el("p", {}, el("span", { class: "status " + v.result }, v.result), " ", v.reason),
    result.difference ? el("p", {}, "differs from the desired tables: ", result.difference.reason || "") : null,
    el("p", { class: "empty" }, `${result.source.port} (${result.source.ip}) → ${result.to.ip}`,
      result.to.port ? ` (${result.to.port})` : "", `; tables: ${result.assumptions.state}; `,
      `conntrack state assumed: ${result.assumptions.ct_state}`));
  replace("picture", picture(svg));
  const rows = result.hops.flatMap(h => h.steps.map((s, i) => ({ h, s, first: i === 0 })));
  replace("hops", table([
    { title: "hop", cell: r => r.first ? `#${r.h.id} ${r.h.switch} (in ${r.h.in_port})` : "" },
    { title: "stage", cell: r => r.s.stage },
    { title: "flow", cell: r => r.s.priority === null || r.s.priority === undefined ? (r.s.match || "") : `priority ${r.s.priority} ${r.s.match || ""}` },
    { title: "actions", cell: r => r.s.actions },
    { title: "owner", cell: r => owner(r.s.owner) },
  ], rows, "no hop: the packet never reached a switch"));
  replace("leaves", table([
    { title: "hop", cell: l => l.hop === null ? "(source)" : "#" + l.hop },
    { title: "result", cell: l => el("span", { class: "status " + l.result }, l.result) },
    { title: "detail", cell: l => l.detail },
  ], result.leaves));
}

header().then(async () => {
  const ports = (await api("/ports")).filter(p => p.router_id === null);     // a VM's, not a router leg
  const select = document.getElementById("port");
  select.replaceChildren(...ports.map(p => el("option", { value: p.id }, `${p.name || p.id} (${p.fixed_ips.map(f => f.ip_address).join(", ")})`)));
  if (q.get("port")) select.value = q.get("port");
  document.getElementById("to").value = q.get("to") || "";
  document.getElementById("proto").value = q.get("proto") || "icmp";
  document.getElementById("dport").value = q.get("dport") || "";
  document.getElementById("actual").checked = !!q.get("actual");
  await run(ports);
}).catch(showError);
