// What every console page shares: the token (this tab's sessionStorage), REST calls with it, the
// change notices (server-sent events read with fetch, so that the token goes in a header), and
// building the page from text only (never HTML from data).
const TOKEN = "fathom.token";

export function token() { return sessionStorage.getItem(TOKEN); }

// Back to the login page, which returns here after.
export function login() {
  sessionStorage.removeItem(TOKEN);
  const next = location.pathname + location.search;
  location.replace("/console/login?next=" + encodeURIComponent(next));
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// GET /v1<path> with the token (or `method` with a JSON `body`); the answer's JSON, or its text with
// `text`, or a Blob with `blob`; a 401 sends the user to the login page.
export async function api(path, { method = "GET", body, text = false, blob = false } = {}) {
  const t = token();
  if (!t) { login(); throw new ApiError(401, "no token"); }
  const headers = { Authorization: "Bearer " + t };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch("/v1" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401) { login(); throw new ApiError(401, "the token is unknown, expired or revoked"); }
  if (r.ok && text) return r.text();
  if (r.ok && blob) return r.blob();
  const answer = await r.json().catch(() => null);
  if (!r.ok) {
    const msg = answer && answer.detail && answer.detail[0] ? answer.detail[0].msg : r.statusText;
    throw new ApiError(r.status, msg);
  }
  return answer;
}

// Every object of a list endpoint, page by page (limit + marker: the API answers at most 1000 at once).
export async function apiList(path, page = 1000) {
  const out = [], sep = path.includes("?") ? "&" : "?";
  for (;;) {
    const batch = await api(`${path}${sep}limit=${page}` + (out.length ? `&marker=${out[out.length - 1].id}` : ""));
    out.push(...batch);
    if (batch.length < page) return out;
  }
}

// GET that answers null for a 403/404 (what this token may not see).
export async function apiMaybe(path) {
  try { return await api(path); }
  catch (e) { if (e.status === 403 || e.status === 404) return null; throw e; }
}

// An element: el("td", {class: "x"}, "text", child, ...). Strings become text nodes.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function statusBadge(status, reason) {
  return el("span", { class: "status " + status, title: reason || "" }, status);
}

// A table: columns [{title, cell: row => text or element}], rows.
export function table(columns, rows, empty = "none") {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map(c => el("th", {}, c.title)))),
    el("tbody", {}, rows.map(r => el("tr", {}, columns.map(c => el("td", {}, c.cell(r)))))));
}

export function replace(id, ...children) {
  document.getElementById(id).replaceChildren(...children.flat().filter(c => c !== null && c !== undefined));
}

// The header of every page: the caller, the pages, log out.
export async function header() {
  const me = await api("/whoami");
  replace("who", el("span", {}, (me.admin ? "admin" : "project ") + (me.admin ? "" : me.project)),
    " ", el("a", { href: "/console/topology" }, "topology"),
    " ", el("a", { href: "/console/trace" }, "trace"),
    " ", el("a", { href: "/console/flow-records" }, "flow records"),
    " ", el("a", { href: "/console/taps" }, "taps"),
    " ", el("a", { href: "/console/benchmarks" }, "benchmarks"),
    " ", el("button", { id: "logout", type: "button" }, "log out"));
  document.getElementById("logout").addEventListener("click", login);
  return me;
}

export function showError(e) {
  if (e && e.status === 401) return;
  replace("error", e ? String(e.message || e) : "");
}

// Follows the change notices: `refresh()` reads and draws the page whole once the stream is open
// (and again after a reconnect, a `refresh` notice, or when the stream cannot be opened);
// `onChanges({seq, changes})` gets each `change` notice (those that come during a refresh, after
// it) and answers whether the page must be read again (default: always); a page that applies the
// changes itself answers false. A drop (a controller restart) reconnects after 0.5 s, doubling to
// 10 s; a revoked token goes back to the login page.
export function follow(refresh, onChanges = () => true) {
  let reading = false, again = false, queue = [];
  async function read() {     // one whole read at a time: asks during it make one more after
    if (reading) { again = true; return; }
    reading = true;
    do {
      again = false; queue = [];
      try { await refresh(); showError(null); } catch (e) { showError(e); }
      for (const data of queue) if (told(data)) again = true;
    } while (again);
    reading = false;
  }
  function told(data) {
    try { return onChanges(data); } catch (e) { showError(e); return true; }
  }
  const live = document.getElementById("live");
  async function run() {
    let opened = false;
    for (let delay = 500; ; delay = Math.min(delay * 2, 10000)) {
      try {
        const r = await fetch("/v1/events", { headers: { Authorization: "Bearer " + token(), Accept: "text/event-stream" } });
        if (r.status === 401) return login();
        if (!r.ok) throw new Error("events: " + r.status);
        delay = 500;
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end); buf = buf.slice(end + 2);
            let name = "message", data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) name = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
            }
            if (name === "unauthorized") return login();
            // connected (again): read everything, for what changed before the stream was open
            if (name === "hello") { opened = true; if (live) live.textContent = "live"; read(); }
            if (name === "refresh") read();
            if (name === "change") {
              const notice = JSON.parse(data);
              if (reading) queue.push(notice); else if (told(notice)) read();
            }
          }
        }
      } catch (e) { /* dropped: reconnect below */ }
      if (!opened) { opened = true; read(); }    // the page, even when the stream cannot be opened
      if (live) live.textContent = "reconnecting";
      await new Promise(res => setTimeout(res, delay));
    }
  }
  run();
}
