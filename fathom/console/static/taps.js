// Tap policies: who is copied to which monitor, the policy's status, and its counters (copies made
// at the senders' switches, copies delivered to the monitors: GET /v1/taps/{id}/stats, read from
// the switches every 2 s; counters move without change notices). A capture of what a monitor
// receives (POST /v1/taps/{id}/capture: tcpdump by the monitor's node agent) is downloaded as a
// pcap file.
import { api, apiList, el, follow, header, replace, showError, statusBadge, table } from "/console/static/console.js";

const who = e => !e ? "" : e.port_name ? e.port_name + (e.node ? " @ " + e.node : "")
  : e.mac === "*" ? "*" : e.mac ? `${e.mac}, ${e.ip}` : "(deleted)";
const filters = t => Object.entries(t.filters).map(([k, v]) => `${k}=${v}`).join(" ") || "*";
const count = (st, k) => st ? st[k].toLocaleString() : "-";
let taps = [];

async function refresh() {
  taps = await apiList("/taps");
  const stats = await Promise.all(taps.map(t => api(`/taps/${t.id}/stats`).catch(() => null)));
  const rows = taps.map((t, i) => ({ ...t, stats: stats[i] }));
  replace("taps", table([
    { title: "name", cell: t => t.name || String(t.id) }, { title: "project", cell: t => t.project_id },
    { title: "sender", cell: t => who(t.sender) }, { title: "receiver", cell: t => who(t.receiver) },
    { title: "monitor", cell: t => [who(t.monitor), who(t.monitor2)].filter(Boolean).join(", ") },
    { title: "direction", cell: t => t.direction }, { title: "filters", cell: filters },
    { title: "status", cell: t => statusBadge(t.status, t.status_reason) },
    { title: "copies (packets)", cell: t => count(t.stats, "copies_packets") },
    { title: "copies (bytes)", cell: t => count(t.stats, "copies_bytes") },
    { title: "delivered (packets)", cell: t => count(t.stats, "delivered_packets") },
    { title: "delivered (bytes)", cell: t => count(t.stats, "delivered_bytes") },
  ], rows, "no tap policies (fathom tap create)"));
  const select = document.getElementById("tap"), chosen = select.value;
  select.replaceChildren(...taps.map(t => el("option", { value: t.id }, t.name || String(t.id))));
  if (taps.some(t => String(t.id) === chosen)) select.value = chosen;
}

async function capture(event) {
  event.preventDefault();
  const id = document.getElementById("tap").value, seconds = Number(document.getElementById("seconds").value);
  const count = document.getElementById("count").value;
  const button = document.querySelector("#capture button");
  button.disabled = true;
  replace("captured", `capturing for ${seconds} s…`);
  try {
    const file = await api(`/taps/${id}/capture`, { method: "POST", blob: true,
      body: { seconds, monitor: document.getElementById("monitor").value, ...(count ? { count: Number(count) } : {}) } });
    const name = `tap-${id}.pcap`;
    const link = el("a", { href: URL.createObjectURL(file), download: name, id: "pcap" }, name);
    replace("captured", `${file.size.toLocaleString()} bytes captured: `, link);
    link.click();
    showError(null);
  } catch (e) { replace("captured", ""); showError(e); }
  button.disabled = false;
}

header().then(() => {
  document.getElementById("capture").addEventListener("submit", capture);
  follow(refresh, ({ changes }) => changes.some(c => c.kind === "tap_policy" || c.kind === "port"));
  setInterval(() => refresh().catch(showError), 2000);
}).catch(showError);
