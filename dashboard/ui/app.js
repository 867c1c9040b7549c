// The meshnode dashboard: one snapshot of the mesh, pushed by the node (server-sent events)
// whenever it changes, rendered with DOM calls only (text, never HTML, from the node).
"use strict";

const $ = (sel) => document.querySelector(sel);
let session = null;
let last = null; // the last snapshot, for a change of what is shown
const shown = { modules: 200, allConsumers: false }; // how much of the long lists is drawn

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = document.createElement("td"); td.appendChild(c); tr.appendChild(td); continue; }
    const [text, cls] = Array.isArray(c) ? c : [c, ""];
    tr.appendChild(el("td", text, cls));
  }
  return tr;
}

function fill(table, rows) {
  const body = $(table + " tbody");
  body.replaceChildren(...rows);
}

const list = (xs) => (xs && xs.length ? xs.join(", ") : "");
// bytes is a byte count as people read it: 1.2 MiB.
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
// quota is a module's use of EVENTS against its quota, with the refusals this node made.
function quota(q) {
  if (!q) return "";
  const used = q.held + q.pending;
  let s = bytes(used);
  if (q.limit) s += ` / ${bytes(q.limit)} (${Math.floor((used * 100) / q.limit)}%)`;
  const refused = Object.values(q.refused || {}).reduce((a, b) => a + b, 0);
  return refused ? `${s}, ${refused} refused` : s;
}
const when = (t) => (t ? new Date(t).toLocaleTimeString() : "");

function render(st) {
  last = st;
  $("#where").textContent = `node ${st.node} · mesh ${st.mesh_id.slice(0, 12)}`;
  const problems = $("#problems");
  problems.hidden = !(st.errors && st.errors.length);
  problems.textContent = st.errors ? "Not read just now: " + st.errors.join("; ") : "";
  problems.className = "error";

  $("#members-count").textContent = `${st.members.length}`;
  fill("#members", st.members.map((m) => row([m.name, [m.state, m.state], [m.jetstream, m.jetstream], m.address, list(m.seats)])));

  fill("#seats", (st.seats || []).map((s) => row([s.seat, s.scope + (s.node ? " " + s.node : ""), s.module || "mesh",
    [s.holder || "unheld", s.holder ? "" : "no"], s.holder_node || "", [s.epoch || "", "num"], [s.backlog, "num"], list(s.users)])));

  $("#modules-count").textContent = `${st.modules.length}`;
  const mods = st.modules.slice(0, shown.modules);
  fill("#modules", mods.map((m) => row([m.module, list(m.emits), list(m.consumes), list(m.tools), list(m.uses), list(m.seats), list(m.secrets), quota((st.quotas || {})[m.module])])));
  const more = $("#modules-more");
  more.hidden = st.modules.length <= shown.modules;
  more.textContent = `Show all ${st.modules.length} modules`;
  graph(st.modules, st.edges || []);

  const operator = session && session.mode === "operator";
  $("#deploy").hidden = !operator;
  fill("#ps", (st.processes || []).map((p) => {
    const actions = document.createElement("span");
    if (operator) {
      const stop = el("button", "Undeploy", "undeploy");
      stop.dataset.module = p.module;
      stop.addEventListener("click", () => { if (confirm(`Undeploy ${p.module} everywhere?`)) deployAction("undeploy", { module: p.module }); });
      actions.append(stop);
    }
    return row([p.module, p.node, p.version, [p.state, p.state], isolation(p.isolation), actions]);
  }));

  const srows = [];
  for (const s of st.streams || []) {
    srows.push(row([el("strong", s.name), [s.messages, "num"], [s.bytes, "num"], [s.replicas, "num"], "", "", ""]));
    for (const c of s.consumers || []) {
      if (!shown.allConsumers && !c.pending && !c.ack_pending && !c.redelivered) continue; // idle: on request
      srows.push(row(["  " + c.name, "", "", "", [c.pending, "num"], [c.ack_pending, "num"], [c.redelivered, "num"]]));
    }
  }
  fill("#streams", srows);

  $("#dead-count").textContent = `${st.dead_total}`;
  fill("#dead", (st.dead || []).map((d) => {
    const actions = document.createElement("span");
    if (session && session.mode === "operator") {
      const replay = el("button", "Replay", "replay");
      replay.dataset.id = d.id;
      replay.addEventListener("click", () => act(d.id, "replay"));
      const drop = el("button", "Drop", "drop");
      drop.dataset.id = d.id;
      drop.addEventListener("click", () => { if (confirm(`Drop dead letter ${d.id} for good?`)) act(d.id, "drop"); });
      actions.append(replay, " ", drop);
    }
    const tr = row([[d.id, "num"], when(d.time), d.event, d.consumer, [d.deliveries, "num"], d.reason, actions]);
    tr.dataset.id = d.id;
    return tr;
  }));

  const forged = Object.entries(st.not_genuine || {});
  const banner = $("#audit-banner");
  banner.hidden = forged.length === 0;
  banner.textContent = forged.length === 0 ? "" :
    `${forged.reduce((n, [, c]) => n + c, 0)} events in this node's audit log since it started are not genuine (` +
    forged.map(([k, c]) => `${k}: ${c}`).join(", ") + "): `meshnode audit verify` lists them.";
  fill("#audit", (st.audit || []).map((a) => row([[a.n, "num"], when(a.received), a.event, a.source, [a.check, a.check === "ok" ? "yes" : "no"], a.body])));
}

// graph draws who talks to whom: the modules that take part, on a circle; events solid,
// jobs dashed.
function graph(modules, edges) {
  const svg = $("#graph");
  const ns = "http://www.w3.org/2000/svg";
  const names = [...new Set(edges.flatMap((e) => [e.from, e.to]))].slice(0, 200);
  svg.replaceChildren();
  svg.hidden = names.length === 0;
  if (!names.length) return;
  const w = svg.clientWidth || 800, h = svg.clientHeight || 320, r = Math.min(w, h) / 2 - 40;
  const at = new Map(names.map((n, i) => {
    const a = (2 * Math.PI * i) / names.length;
    return [n, [w / 2 + r * Math.cos(a), h / 2 + r * Math.sin(a)]];
  }));
  for (const e of edges) {
    const a = at.get(e.from), b = at.get(e.to);
    if (!a || !b) continue;
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", a[0]); line.setAttribute("y1", a[1]);
    line.setAttribute("x2", b[0]); line.setAttribute("y2", b[1]);
    line.setAttribute("class", e.kind);
    const title = document.createElementNS(ns, "title");
    title.textContent = `${e.from} → ${e.to}: ${e.kind} ${e.what}`;
    line.appendChild(title);
    svg.appendChild(line);
  }
  for (const [n, [x, y]] of at) {
    const c = document.createElementNS(ns, "circle");
    c.setAttribute("cx", x); c.setAttribute("cy", y); c.setAttribute("r", 5);
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x + 8); t.setAttribute("y", y + 4);
    t.textContent = n;
    svg.append(c, t);
  }
}

// deployAction deploys or undeploys, as the CLI does; the next snapshot shows the outcome.
async function deployAction(action, body) {
  const err = $("#deploy-error");
  err.hidden = true;
  const resp = await fetch(`/ui/api/${action}`, { method: "POST", credentials: "same-origin",
    headers: { "X-CSRF-Token": session.csrf, "Content-Type": "application/json" }, body: JSON.stringify(body) })
    .catch((e) => ({ ok: false, status: e.message, json: async () => ({}) }));
  if (!resp.ok) {
    const reply = await resp.json().catch(() => ({}));
    err.textContent = `${action} ${body.module}: ${reply.error || resp.status}`;
    err.hidden = false;
  }
  return resp.ok;
}

$("#deploy").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const nodes = String(f.get("nodes") || "").split(",").map((s) => s.trim()).filter(Boolean);
  await deployAction("deploy", { module: f.get("module"), version: f.get("version"), nodes, instances: Number(f.get("instances")) || 1 });
});

async function act(id, action) {
  const err = $("#dead-error");
  err.hidden = true;
  const resp = await fetch(`/ui/api/dead/${id}/${action}`, { method: "POST", headers: { "X-CSRF-Token": session.csrf }, credentials: "same-origin" });
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    err.textContent = `${action} ${id}: ${body.error || resp.status}`;
    err.hidden = false;
    return;
  }
  const tr = document.querySelector(`#dead tbody tr[data-id="${id}"]`);
  if (tr) {
    tr.remove();
    const count = $("#dead-count");
    count.textContent = String(Math.max(0, Number(count.textContent) - 1));
  }
}

// live keeps the page current. A browser opens at most six HTTP/1.1 connections to a host,
// and each event stream holds one for good: so the open pages of one node share one stream.
// The page that holds the node's lock (Web Locks) reads the stream and passes each snapshot
// to the others (BroadcastChannel); when it closes, another takes the lock and the stream
// over. Where the browser has neither (a plain-http address that is not loopback), each
// page reads its own stream.
function live() {
  const name = "meshnode-ui-" + session.node;
  const show = (data) => { $("#live").textContent = "live"; $("#live").className = "on"; render(JSON.parse(data)); };
  if (!("locks" in navigator) || !("BroadcastChannel" in window)) {
    stream(show, () => {});
    return;
  }
  const channel = new BroadcastChannel(name);
  channel.onmessage = (e) => show(e.data);
  $("#live").textContent = "live";
  $("#live").className = "on";
  navigator.locks.request(name, () => new Promise((release) => {
    stream((data) => { channel.postMessage(data); show(data); }, release);
  }));
}

// stream reads the node's event stream, handing each snapshot to each; done is called when
// the stream ends for good (the session is gone).
function stream(each, done) {
  const src = new EventSource("/ui/api/events");
  src.addEventListener("state", (e) => each(e.data));
  // A page left for another keeps no stream open (a page the browser keeps for its Back
  // button would hold one, and the node's snapshots, for nothing); coming back reloads it.
  // The lock goes too, so that another open page takes the stream over.
  addEventListener("pagehide", () => { src.close(); done(); });
  src.onerror = async () => {
    $("#live").textContent = "reconnecting…";
    $("#live").className = "off";
    // A session the node no longer knows (it restarted, or the session ended) will not come
    // back: say how to log in again instead of retrying for ever.
    const resp = await fetch("/ui/api/session", { credentials: "same-origin" }).catch(() => null);
    if (resp && resp.status === 401) {
      src.close();
      $("#app").hidden = true;
      $("#login").hidden = false;
      $("#live").textContent = "logged out";
      done();
    }
  };
}

addEventListener("pageshow", (e) => { if (e.persisted) location.reload(); });

async function start() {
  $("#modules-more").addEventListener("click", () => { shown.modules = Infinity; if (last) render(last); });
  $("#all-consumers").addEventListener("change", (e) => { shown.allConsumers = e.target.checked; if (last) render(last); });
  // Both at once: the snapshot is the page's first view, and a round trip less is most of it.
  const stateReq = fetch("/ui/api/state", { credentials: "same-origin" });
  const resp = await fetch("/ui/api/session", { credentials: "same-origin" });
  if (resp.status === 401) {
    $("#login").hidden = false;
    $("#live").textContent = "";
    return;
  }
  session = await resp.json();
  $("#mode").textContent = session.mode === "operator" ? "operator" : "read-only";
  $("#app").hidden = false;
  const first = await stateReq;
  if (first.ok) {
    render(await first.json());
    performance.mark("meshnode-rendered"); // the first view with data: what the bench times
  }
  live();
}

// A fault of this page shows where the node's own problems do.
window.addEventListener("error", (e) => {
  const p = $("#problems");
  p.hidden = false;
  p.className = "error";
  p.textContent = "This page failed: " + e.message;
});

start();

// isolation is a running process's isolation in a few words (DESIGN §13), the whole of it in
// the title: its user, its Landlock ABI, how its processes are contained.
function isolation(iso) {
  if (!iso) return "-";
  const user = iso.user.startsWith("the node's") ? "node's uid" : iso.user;
  const contained = iso.cgroup ? "cgroup" : iso.subreaper ? "subreaper" : "no containment";
  const text = `${user} · landlock ${iso.landlock.replace("abi ", "")} · ${contained}` + (iso.reduced ? " (reduced)" : "");
  const span = el("span", text, iso.reduced ? "reduced" : "isolated");
  span.title = JSON.stringify(iso, null, 1);
  return span;
}
