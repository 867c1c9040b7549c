// The meshnode console: pages (Overview, Nodes, Modules and a page per module, Seats, Streams,
// Dead letters, Audit) behind addresses a browser can bookmark (#/modules/shop). One snapshot
// of the mesh is pushed by the node (server-sent events) whenever it changes; a module's page,
// a dead letter and an audit search are asked for when shown. Rendered with DOM calls only
// (text, never HTML, from the node).
"use strict";

const $ = (sel) => document.querySelector(sel);
let session = null;
let last = null; // the last snapshot, for a change of page or of what is shown
const shown = { modules: 200, allConsumers: false }; // how much of the long lists is drawn
const sorts = {}; // by table id: {col, dir}
let route = { page: "overview", arg: "", query: new URLSearchParams() };
let marked = false; // the first view with data is marked once (what the bench and the tests time)

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function link(text, href) {
  const a = el("a", text);
  a.href = href;
  return a;
}

const moduleLink = (name) => (name ? link(name, "#/modules/" + encodeURIComponent(name)) : "");

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = document.createElement("td"); td.appendChild(c); tr.appendChild(td); continue; }
    const [text, cls] = Array.isArray(c) ? c : [c, ""];
    tr.appendChild(el("td", text, cls));
  }
  return tr;
}

// fill sets a table's rows; an empty table says so in one row (class "empty").
function fill(table, rows) {
  if (!rows.length) {
    const td = el("td", "none", "muted");
    td.colSpan = $(table + " thead tr").cells.length;
    const tr = document.createElement("tr");
    tr.className = "empty";
    tr.appendChild(td);
    rows = [tr];
  }
  $(table + " tbody").replaceChildren(...rows);
}

// sorted sorts items by the column the table's header was clicked on: key(item, col) gives
// the value compared (numbers as numbers).
function sorted(table, items, key) {
  const s = sorts[table];
  if (!s) return items;
  const out = [...items];
  out.sort((a, b) => {
    const x = key(a, s.col), y = key(b, s.col);
    const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
    return s.dir * c;
  });
  return out;
}

// Each sortable table's header sorts by its column, again to turn the order round.
for (const table of document.querySelectorAll("table.sortable")) {
  table.querySelectorAll("th").forEach((th, col) => {
    th.title = "sort";
    th.addEventListener("click", () => {
      const id = "#" + table.id;
      const s = sorts[id];
      sorts[id] = { col, dir: s && s.col === col ? -s.dir : 1 };
      table.querySelectorAll("th").forEach((h) => h.classList.remove("asc", "desc"));
      th.classList.add(sorts[id].dir > 0 ? "asc" : "desc");
      if (last) render(last);
    });
  });
}

const list = (xs) => (xs && xs.length ? xs.join(", ") : "");
// bytes is a byte count as people read it: 1.2 MiB.
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  n = Number(n) || 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
// when is a time as ISO 8601 in UTC, to the second: 2026-12-06 10:15:03Z.
const when = (t) => (t && !String(t).startsWith("0001") ? new Date(t).toISOString().slice(0, 19).replace("T", " ") + "Z" : "");
// quota is a module's use of EVENTS against its quota, with the refusals this node made.
function quota(q) {
  if (!q) return "";
  const used = q.held + q.pending;
  let s = bytes(used);
  if (q.limit) s += ` / ${bytes(q.limit)} (${Math.floor((used * 100) / q.limit)}%)`;
  const refused = Object.values(q.refused || {}).reduce((a, b) => a + b, 0);
  return refused ? `${s}, ${refused} refused` : s;
}

// builtinByDesign says a seat is the mesh's own and held only where it is needed: mesh-git
// where a node keeps repositories, mesh-build-machine where a builder runs. Unheld, it is
// idle, not failing; only mesh-controller and mesh-vault must always be held.
const builtinByDesign = (s) => !s.module && s.seat !== "mesh-controller" && s.seat !== "mesh-vault";

// ---- routing

// parseRoute reads the address: #/page/arg?query.
function parseRoute() {
  const h = location.hash.replace(/^#\/?/, "");
  const at = h.indexOf("?");
  // The path is decoded here, the query by URLSearchParams (once: a + or %25 in a value stays).
  let path = at < 0 ? h : h.slice(0, at);
  try { path = decodeURIComponent(path); } catch { path = ""; }
  const q = at < 0 ? "" : h.slice(at + 1);
  const [page, ...rest] = path.split("/");
  const pages = ["overview", "nodes", "modules", "seats", "streams", "dead", "audit"];
  let p = page || "overview";
  if (!pages.includes(p)) p = "overview";
  const arg = rest.join("/");
  if (p === "modules" && arg) p = "module";
  return { page: p, arg, query: new URLSearchParams(q || "") };
}

function show() {
  route = parseRoute();
  for (const s of document.querySelectorAll("section.page")) s.hidden = s.dataset.page !== route.page;
  const nav = route.page === "module" ? "modules" : route.page;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === nav);
  document.title = `meshnode · ${route.page === "module" ? route.arg : nav}`;
  if (last) render(last);
  if (route.page === "module") loadModule(route.arg);
  if (route.page === "dead") loadDeadLetter(route.arg);
  if (route.page === "audit") searchAudit(route.query, false);
}

addEventListener("hashchange", show);

// rendered marks the page's first view with data.
function rendered() {
  if (marked) return;
  marked = true;
  performance.mark("meshnode-rendered");
}

// ---- the snapshot's pages

function render(st) {
  last = st;
  $("#where").textContent = `node ${st.node} · mesh ${st.mesh_id.slice(0, 12)}`;
  const problems = $("#problems");
  problems.hidden = !(st.errors && st.errors.length);
  problems.textContent = st.errors ? "Not read just now: " + st.errors.join("; ") : "";
  banner(st);
  $("#nav-dead").textContent = st.dead_total ? String(st.dead_total) : "";
  switch (route.page) {
    case "overview": overview(st); break;
    case "nodes": nodes(st); break;
    case "modules": modules(st); break;
    case "seats": seats(st); break;
    case "streams": streams(st); break;
    case "dead": dead(st); break;
    default: return; // module and audit pages have data of their own
  }
  rendered();
}

function banner(st) {
  const forged = Object.entries(st.not_genuine || {});
  $("#audit-banner").hidden = forged.length === 0;
  const n = forged.reduce((n, [, c]) => n + c, 0);
  $("#audit-banner-text").textContent = forged.length === 0 ? "" :
    `${n} ${n === 1 ? "event" : "events"} in this node's audit log since it started ${n === 1 ? "is" : "are"} not genuine (` +
    forged.map(([k, c]) => `${k}: ${c}`).join(", ") + ").";
}

function card(label, value, cls, href) {
  const c = el(href ? "a" : "div", null, "card " + (cls || ""));
  if (href) c.href = href;
  c.append(el("strong", value), el("span", label));
  return c;
}

function overview(st) {
  const alive = st.members.filter((m) => m.state === "alive").length;
  const ps = st.processes || [];
  const running = ps.filter((p) => p.state === "running").length;
  const seatsAll = st.seats || [];
  const needed = seatsAll.filter((s) => !builtinByDesign(s) || s.holder);
  const held = needed.filter((s) => s.holder).length;
  const forged = Object.values(st.not_genuine || {}).reduce((a, b) => a + b, 0);
  $("#cards").replaceChildren(
    card("nodes alive", `${alive} / ${st.members.length}`, alive === st.members.length ? "ok" : "bad", "#/nodes"),
    card("modules", st.modules.length, "", "#/modules"),
    card("processes running", `${running} / ${ps.length}`, running === ps.length ? "ok" : "bad", "#/modules"),
    card("seats held", `${held} / ${needed.length}`, held === needed.length ? "ok" : "bad", "#/seats"),
    card("streams", (st.streams || []).length, "", "#/streams"),
    card("dead letters", st.dead_total, st.dead_total ? "bad" : "ok", "#/dead"),
    card("not genuine", forged, forged ? "bad" : "ok", "#/audit?not_genuine=1"));
  chart("#chart-events", "#events-now", st.rates, "events");
  chart("#chart-errors", "#errors-now", st.rates, "errors");
}

// chart draws one of the node's rates over the last hour: a bar per interval, the scale its
// highest.
function chart(svgSel, nowSel, rates, what) {
  const svg = $(svgSel);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  if (!rates) {
    $(nowSel).textContent = "(counting: the first figures come within a minute)";
    return;
  }
  const secs = rates.every_ms / 1000;
  const xs = rates[what].map((n) => n / secs);
  const top = Math.max(...xs, 0);
  $(nowSel).textContent = `now ${xs[xs.length - 1].toFixed(1)}/s · highest ${top.toFixed(1)}/s · until ${when(rates.end)}`;
  const w = svg.clientWidth || 600, h = svg.clientHeight || 80;
  const slots = Math.max(3600 / secs, xs.length);
  const bw = w / slots;
  xs.forEach((x, i) => {
    const bh = top ? (x / top) * (h - 2) : 0;
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", w - (xs.length - i) * bw);
    r.setAttribute("y", h - bh);
    r.setAttribute("width", Math.max(bw - 0.5, 0.5));
    r.setAttribute("height", bh);
    const t = document.createElementNS(ns, "title");
    t.textContent = `${x.toFixed(1)}/s`;
    r.appendChild(t);
    svg.appendChild(r);
  });
  for (const [x, anchor, text] of [[4, "start", "1 h ago"], [w - 4, "end", "now"]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", 12); t.setAttribute("text-anchor", anchor);
    t.textContent = text;
    svg.appendChild(t);
  }
}

function nodes(st) {
  $("#members-count").textContent = `${st.members.length}`;
  const ms = sorted("#members", st.members, (m, c) => [m.name, m.state, m.jetstream, m.version, m.address, m.gossip_addr, list(m.seats)][c]);
  fill("#members", ms.map((m) => {
    const state = m.state === "alive" ? "alive" : m.state === "suspect" ? "suspect" : "offline";
    const tr = row([m.name, [m.state === "alive" || m.state === "suspect" ? m.state : `offline (${m.state})`, state], [m.jetstream, m.jetstream],
      m.version || "", m.address, m.gossip_addr || "", list(m.seats)]);
    if (state === "offline") tr.className = "gone";
    return tr;
  }));
}

function modules(st) {
  const operator = session && session.mode === "operator";
  $("#deploy").hidden = !operator;
  const ps = sorted("#ps", st.processes || [], (p, c) => [p.module, p.node, p.version, p.state, p.restarts, p.since, p.reason][c]);
  $("#ps-count").textContent = `${ps.length}`;
  fill("#ps", ps.map((p) => {
    const actions = document.createElement("span");
    if (operator) {
      const stop = el("button", "Undeploy", "undeploy");
      stop.dataset.module = p.module;
      stop.addEventListener("click", () => { if (confirm(`Undeploy ${p.module} everywhere?`)) deployAction("undeploy", { module: p.module }); });
      actions.append(stop);
    }
    return row([moduleLink(p.module), p.node, p.version, [p.state, p.state], [p.restarts, "num"], when(p.since), p.reason || "", isolation(p.isolation), actions]);
  }));

  const q = $("#modules-filter").value.trim().toLowerCase();
  const quotas = st.quotas || {};
  const idle = { held: 0, pending: 0, limit: st.quota_limit || 0 }; // a module left out: nothing held
  let mods = st.modules;
  if (q) {
    mods = mods.filter((m) => [m.module, ...(m.emits || []), ...(m.consumes || []), ...(m.tools || []), ...(m.uses || []), ...(m.seats || []), ...(m.secrets || [])]
      .some((s) => s.toLowerCase().includes(q)));
  }
  mods = sorted("#modules", mods, (m, c) => c === 7 ? ((quotas[m.module] || {}).held || 0) :
    [m.module, list(m.emits), list(m.consumes), list(m.tools), list(m.uses), list(m.seats), list(m.secrets)][c]);
  $("#modules-count").textContent = q ? `${mods.length} of ${st.modules.length}` : `${st.modules.length}`;
  fill("#modules", mods.slice(0, shown.modules).map((m) => row([moduleLink(m.module), list(m.emits), list(m.consumes), list(m.tools), list(m.uses),
    list(m.seats), list(m.secrets), quota(quotas[m.module] || idle)])));
  const more = $("#modules-more");
  more.hidden = mods.length <= shown.modules;
  more.textContent = `Show all ${mods.length} modules`;
}

function seats(st) {
  const ss = sorted("#seats", st.seats || [], (s, c) => [s.seat, s.scope, s.module, s.holder, s.holder_node, s.epoch, s.since, s.backlog, list(s.users)][c]);
  fill("#seats", ss.map((s) => {
    let holder = [s.holder || "unheld", s.holder ? "" : "no"];
    if (!s.holder && builtinByDesign(s)) holder = ["idle: held only where needed", "muted"];
    return row([s.seat, s.scope + (s.node ? " " + s.node : ""), s.module ? moduleLink(s.module) : "mesh", holder, s.holder_node || "",
      [s.epoch || "", "num"], when(s.since), [s.backlog, "num"], list(s.users)]);
  }));
}

function streams(st) {
  const q = $("#streams-filter").value.trim().toLowerCase();
  const rows = [];
  for (const s of st.streams || []) {
    const cs = (s.consumers || []).filter((c) => (shown.allConsumers || c.pending || c.ack_pending || c.redelivered) &&
      (!q || s.name.toLowerCase().includes(q) || c.name.toLowerCase().includes(q)));
    if (q && !s.name.toLowerCase().includes(q) && !cs.length) continue;
    rows.push(row([el("strong", s.name), [s.messages, "num"], [bytes(s.bytes), "num"], [s.replicas, "num"], "", "", ""]));
    for (const c of cs) {
      rows.push(row(["  " + c.name, "", "", "", [c.pending, "num"], [c.ack_pending, "num"], [c.redelivered, "num"]]));
    }
  }
  fill("#streams", rows);
}

// shownDead are the dead letters the page's filter lets through (by consumer or event, in
// any case).
function shownDead(st) {
  const q = $("#dead-filter").value.trim().toLowerCase();
  return (st.dead || []).filter((d) => !q || d.consumer.toLowerCase().includes(q) || d.event.toLowerCase().includes(q));
}

function dead(st) {
  const operator = session && session.mode === "operator";
  const q = $("#dead-filter").value.trim();
  let ds = shownDead(st);
  ds = sorted("#dead", ds, (d, c) => [d.id, d.time, d.event, d.consumer, d.deliveries, d.reason][c]);
  $("#dead-count").textContent = q ? `${ds.length} shown of ${st.dead_total}` : `${st.dead_total}`;
  $("#dead-replay-all").hidden = !operator || ds.length === 0;
  $("#dead-replay-all").textContent = q ? `Replay the ${ds.length} shown` : "Replay all";
  fill("#dead", ds.map((d) => {
    const actions = document.createElement("span");
    if (operator) {
      const replay = el("button", "Replay", "replay");
      replay.dataset.id = d.id;
      replay.addEventListener("click", () => act(d.id, "replay"));
      const drop = el("button", "Drop", "drop");
      drop.dataset.id = d.id;
      drop.addEventListener("click", () => { if (confirm(`Drop dead letter ${d.id} for good?`)) act(d.id, "drop"); });
      actions.append(replay, " ", drop);
    }
    const tr = row([link(String(d.id), "#/dead/" + d.id), when(d.time), d.event, d.consumer, [d.deliveries, "num"], d.reason, actions]);
    tr.dataset.id = d.id;
    return tr;
  }));
}

// ---- pages with data of their own

let moduleTimer = null;

// loadModule shows a module's page, and asks again every 5 s while it is shown.
async function loadModule(name) {
  clearTimeout(moduleTimer);
  $("#module-name").textContent = name;
  const resp = await api(`/ui/api/modules/${encodeURIComponent(name)}`);
  if (route.page !== "module" || route.arg !== name) return; // left meanwhile
  const err = $("#module-error");
  // Asked again in 5 s while shown, after a failure too (a node restarting answers again).
  moduleTimer = setTimeout(() => { if (route.page === "module" && route.arg === name) loadModule(name); }, 5000);
  if (!resp.ok) {
    err.textContent = resp.error;
    err.hidden = false;
    $("#module-body").hidden = true;
    return;
  }
  err.hidden = true;
  modulePage(resp.body);
  $("#module-body").hidden = false;
  rendered();
}

function modulePage(m) {
  $("#module-key").textContent = m.public_key;
  $("#module-meta").textContent = `registered ${when(m.registered)} · updated ${when(m.updated)}` + (m.errors ? ` · not read just now: ${m.errors.join("; ")}` : "");
  $("#module-quota").textContent = m.quota ? quota(m.quota) : "no events held";
  talks(m.module, m.talks);
  fill("#module-seats", m.seats.map((s) => row([s.seat, s.scope + (s.node ? " " + s.node : ""), [s.holder || "unheld", s.holder ? "" : "no"], s.holder_node || "", [s.epoch || "", "num"]])));
  fill("#module-provisions", m.provisions.map((p) => row([p.interface, p.provider, [p.state, p.state], when(p.since), p.reason])));
  fill("#module-ps", m.processes.map((p) => row([p.node, [p.instance, "num"], p.version, [p.state, p.state], [p.pid || "", "num"], [p.restarts, "num"],
    when(p.since), p.reason || "", isolation(p.isolation)])));
  fill("#module-consumers", m.consumers.map((c) => row([c.stream, c.name, [c.pending, "num"], [c.ack_pending, "num"], [c.redelivered, "num"]])));
  fill("#module-events", m.events.map((a) => row([[a.n, "num"], when(a.received), a.event, [a.check, a.check === "ok" ? "yes" : "no"], a.body])));
  fill("#module-builds", m.builds.map((b) => row([when(b.started), [b.status, b.status], b.version || "", (b.commit || "").slice(0, 12), b.trigger, b.reason || ""])));
  $("#module-logs-node").textContent = m.logs.node ? `on ${m.logs.node}, the last 8 KiB` : "";
  $("#module-logs").textContent = m.logs.text || m.logs.hint || "(no output yet)";
  const perms = [];
  for (const s of m.permissions.publish || []) perms.push(row(["publish", s]));
  for (const s of m.permissions.subscribe || []) perms.push(row(["subscribe", s.subject + (s.queue ? ` (queue ${s.queue})` : "")]));
  fill("#module-perms", perms);
  $("#module-manifest").textContent = m.manifest;
}

// talks draws who the module talks to: the module in the middle, who sends to it on the
// left, whom it sends to on the right; arrows go the way the events or jobs go.
function talks(name, edges) {
  const svg = $("#module-graph");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const defs = document.createElementNS(ns, "defs");
  for (const kind of ["events", "jobs"]) {
    const m = document.createElementNS(ns, "marker");
    m.setAttribute("id", "arrow-" + kind);
    m.setAttribute("viewBox", "0 0 10 10"); m.setAttribute("refX", "10"); m.setAttribute("refY", "5");
    m.setAttribute("markerWidth", "7"); m.setAttribute("markerHeight", "7"); m.setAttribute("orient", "auto");
    const p = document.createElementNS(ns, "path");
    p.setAttribute("d", "M0,0 L10,5 L0,10 z");
    p.setAttribute("class", kind);
    m.appendChild(p);
    defs.appendChild(m);
  }
  svg.appendChild(defs);
  const from = [...new Set(edges.filter((e) => e.to === name && e.from !== name).map((e) => e.from))].slice(0, 12);
  const to = [...new Set(edges.filter((e) => e.from === name && e.to !== name).map((e) => e.to))].slice(0, 12);
  const w = svg.clientWidth || 560, h = Math.max(120, 28 * Math.max(from.length, to.length, 1) + 20);
  svg.setAttribute("height", h);
  const centre = [w / 2, h / 2];
  const place = (names, x) => new Map(names.map((n, i) => [n, [x, ((i + 1) * h) / (names.length + 1)]]));
  const left = place(from, 90), right = place(to, w - 90);
  const line = (a, b, kind, title) => {
    const l = document.createElementNS(ns, "line");
    l.setAttribute("x1", a[0]); l.setAttribute("y1", a[1]); l.setAttribute("x2", b[0]); l.setAttribute("y2", b[1]);
    l.setAttribute("class", kind);
    l.setAttribute("marker-end", `url(#arrow-${kind})`);
    const t = document.createElementNS(ns, "title");
    t.textContent = title;
    l.appendChild(t);
    svg.appendChild(l);
  };
  for (const e of edges) {
    if (e.to === name && left.has(e.from)) line([left.get(e.from)[0] + 40, left.get(e.from)[1]], [centre[0] - 50, centre[1]], e.kind, `${e.from} → ${name}: ${e.kind} ${e.what}`);
    if (e.from === name && right.has(e.to)) line([centre[0] + 50, centre[1]], [right.get(e.to)[0] - 40, right.get(e.to)[1]], e.kind, `${name} → ${e.to}: ${e.kind} ${e.what}`);
  }
  const label = (n, [x, y], self) => {
    const a = document.createElementNS(ns, "a");
    a.setAttribute("href", "#/modules/" + encodeURIComponent(n));
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y + 4); t.setAttribute("text-anchor", "middle");
    if (self) t.setAttribute("class", "self");
    t.textContent = n;
    a.appendChild(t);
    svg.appendChild(a);
  };
  label(name, centre, true);
  for (const [n, at] of left) label(n, at);
  for (const [n, at] of right) label(n, at);
  if (!from.length && !to.length) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", centre[0]); t.setAttribute("y", centre[1] + 24); t.setAttribute("text-anchor", "middle");
    t.setAttribute("class", "muted");
    t.textContent = "no module sends it events or work, and it sends none";
    svg.appendChild(t);
  }
}

// loadDeadLetter shows one dead letter whole (#/dead/<id>): its headers and body.
async function loadDeadLetter(id) {
  const box = $("#dead-letter");
  if (!id) { box.hidden = true; return; }
  const resp = await api(`/ui/api/dead/${encodeURIComponent(id)}`);
  if (route.page !== "dead" || route.arg !== id) return;
  const err = $("#dead-error");
  if (!resp.ok) {
    err.textContent = `dead letter ${id}: ${resp.error}`;
    err.hidden = false;
    box.hidden = true;
    return;
  }
  err.hidden = true;
  const d = resp.body;
  $("#dead-letter-id").textContent = `${d.id}: ${d.subject}`;
  const hs = [["consumer", d.consumer], ["reason", d.reason], ["deliveries", String(d.deliveries)], ["time", when(d.time)], ["event id", d.event_id]];
  for (const [k, vs] of Object.entries(d.headers || {})) hs.push([k, vs.join(", ")]);
  fill("#dead-headers", hs.map(([k, v]) => row([k, v])));
  let body = "";
  try { body = new TextDecoder().decode(Uint8Array.from(atob(d.body || ""), (c) => c.charCodeAt(0))); } catch { body = "(not text)"; }
  $("#dead-body").textContent = body;
  box.hidden = false;
}

let auditNext = 0;

// searchAudit asks the node's audit log for the records the address names (#/audit?...),
// newest first; more appends the next older page.
async function searchAudit(query, more) {
  const form = $("#audit-search");
  if (!more) {
    for (const name of ["source", "event", "since", "until"]) form.elements[name].value = query.get(name) || "";
    form.elements.not_genuine.checked = query.get("not_genuine") === "1";
  }
  const q = new URLSearchParams(query);
  if (more) q.set("before", auditNext);
  const resp = await api("/ui/api/audit?" + q.toString());
  if (route.page !== "audit") return;
  const err = $("#audit-error");
  if (!resp.ok) {
    err.textContent = resp.error;
    err.hidden = false;
    return;
  }
  err.hidden = true;
  const rows = resp.body.records.map((a) => row([[a.n, "num"], when(a.received), a.event, a.source, [a.check, a.check === "ok" ? "yes" : "no"], a.body]));
  if (more) $("#audit tbody").append(...rows);
  else fill("#audit", rows);
  auditNext = resp.body.next || 0;
  $("#audit-older").hidden = !auditNext;
  rendered();
}

$("#audit-search").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = new URLSearchParams();
  for (const [k, v] of new FormData(ev.target)) if (v) q.set(k, v);
  const next = "#/audit" + (q.toString() ? "?" + q.toString() : "");
  if (location.hash === next) searchAudit(q, false);
  else location.hash = next;
});
$("#audit-older").addEventListener("click", () => searchAudit(route.query, true));

// api asks the node for JSON: {ok, body} or {ok: false, error}.
async function api(path, init) {
  try {
    const resp = await fetch(path, { credentials: "same-origin", ...(init || {}) });
    const body = await resp.json().catch(() => ({}));
    return resp.ok ? { ok: true, body } : { ok: false, error: body.error || `${resp.status} ${resp.statusText}` };
  } catch (e) {
    return { ok: false, error: e.message };
  }
}

const act_ = (path, body) => api(path, { method: "POST", headers: { "X-CSRF-Token": session.csrf, "Content-Type": "application/json" },
  body: body === undefined ? undefined : JSON.stringify(body) });

// deployAction deploys or undeploys, as the CLI does; the next snapshot shows the outcome.
async function deployAction(action, body) {
  const err = $("#deploy-error");
  err.hidden = true;
  const resp = await act_(`/ui/api/${action}`, body);
  if (!resp.ok) {
    err.textContent = `${action} ${body.module}: ${resp.error}`;
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
  const resp = await act_(`/ui/api/dead/${id}/${action}`);
  if (!resp.ok) {
    err.textContent = `${action} ${id}: ${resp.error}`;
    err.hidden = false;
    return;
  }
  const tr = document.querySelector(`#dead tbody tr[data-id="${id}"]`);
  if (tr) tr.remove();
  if (route.arg === String(id)) location.hash = "#/dead";
}

// Replay all: with no filter, every dead letter of every consumer (the node's replay-all,
// beyond the newest 100 listed); with one, exactly the letters shown, one at a time.
$("#dead-replay-all").addEventListener("click", async () => {
  const err = $("#dead-error");
  if (!$("#dead-filter").value.trim()) {
    if (!confirm(`Replay every dead letter (${last.dead_total}) of every consumer?`)) return;
    const resp = await act_("/ui/api/dead-replay-all");
    err.hidden = resp.ok && !Object.keys(resp.body.refused || {}).length;
    err.textContent = resp.ok ? `replayed ${resp.body.replayed}; refused: ` + Object.entries(resp.body.refused || {}).map(([k, v]) => `${k} (${v})`).join(", ") : resp.error;
    return;
  }
  const ds = shownDead(last);
  if (!ds.length || !confirm(`Replay the ${ds.length} dead letters shown?`)) return;
  const failed = [];
  for (const d of ds) {
    const resp = await act_(`/ui/api/dead/${d.id}/replay`);
    if (!resp.ok) failed.push(`${d.id}: ${resp.error}`);
  }
  err.hidden = failed.length === 0;
  err.textContent = `replayed ${ds.length - failed.length} of ${ds.length}` + (failed.length ? "; not: " + failed.join("; ") : "");
});

for (const [sel, ev] of [["#modules-filter", "input"], ["#streams-filter", "input"], ["#dead-filter", "input"]]) {
  $(sel).addEventListener(ev, () => { if (last) render(last); });
}

// ---- liveness

function setLive(on, text) {
  $("#live").textContent = text;
  $("#live").className = on ? "on" : "off";
  document.body.classList.toggle("stale", !on); // what is shown may be old: dimmed
}

// live keeps the page current. A browser opens at most six HTTP/1.1 connections to a host,
// and each event stream holds one for good: so the open pages of one node share one stream.
// The page that holds the node's lock (Web Locks) reads the stream and passes each snapshot
// to the others (BroadcastChannel); when it closes, another takes the lock and the stream
// over. Where the browser has neither (a plain-http address that is not loopback), each
// page reads its own stream.
function live() {
  const name = "meshnode-ui-" + session.node;
  const take = (data) => { setLive(true, "live"); render(JSON.parse(data)); };
  if (!("locks" in navigator) || !("BroadcastChannel" in window)) {
    stream(take, () => {});
    return;
  }
  const channel = new BroadcastChannel(name);
  channel.onmessage = (e) => take(e.data);
  setLive(true, "live");
  navigator.locks.request(name, () => new Promise((release) => {
    stream((data) => { channel.postMessage(data); take(data); }, release);
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
    setLive(false, "reconnecting…");
    // A session the node no longer knows (it ended, or the operator's key changed) will not
    // come back: say how to log in again instead of retrying for ever.
    const resp = await fetch("/ui/api/session", { credentials: "same-origin" }).catch(() => null);
    if (resp && resp.status === 401) {
      src.close();
      loggedOut("logged out");
      done();
    }
  };
}

function loggedOut(text) {
  $("#app").hidden = true;
  $("#nav").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  $("#live").textContent = text;
}

$("#logout").addEventListener("click", async () => {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin" }).catch(() => null);
  loggedOut("logged out");
});

addEventListener("pageshow", (e) => { if (e.persisted) location.reload(); });

async function start() {
  $("#modules-more").addEventListener("click", () => { shown.modules = Infinity; if (last) render(last); });
  $("#all-consumers").addEventListener("change", (e) => { shown.allConsumers = e.target.checked; if (last) render(last); });
  route = parseRoute();
  // Both at once: the snapshot is the page's first view, and a round trip less is most of it.
  const stateReq = fetch("/ui/api/state", { credentials: "same-origin" });
  const resp = await fetch("/ui/api/session", { credentials: "same-origin" });
  if (resp.status === 401) {
    loggedOut("");
    return;
  }
  session = await resp.json();
  $("#mode").textContent = session.mode === "operator" ? "operator" : "read-only";
  $("#app").hidden = false;
  $("#nav").hidden = false;
  $("#logout").hidden = false;
  for (const e of document.querySelectorAll(".operator")) if (e.id !== "dead-replay-all") e.hidden = session.mode !== "operator";
  const first = await stateReq;
  if (first.ok) last = await first.json();
  show();
  live();
}

// A fault of this page shows where the node's own problems do (an async step's too).
function failed(message) {
  const p = $("#problems");
  p.hidden = false;
  p.textContent = "This page failed: " + message;
}
window.addEventListener("error", (e) => failed(e.message));
window.addEventListener("unhandledrejection", (e) => failed(e.reason && e.reason.message ? e.reason.message : String(e.reason)));

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
