// zstalk's dashboard (issue 50; the server's side: protocol/fronts/http/dashboard.py, ui.py).
//
// How it works: GET /ui/session says who this browser is; nobody logs in with POST /ui/login,
// which sets an HttpOnly cookie this script never sees. Then GET /v1/dashboard/events sends a
// snapshot a second, and each table is filled from it, its rows kept by name (a row on screen
// stays the same element: a button under the pointer is not swapped away). Actions go to the
// operator API with the header X-Zstalk-Action: 1, which the cookie needs to act. Everything
// the server says is set as textContent (a job's body too, or shown as hex): nothing it sends
// ever becomes HTML. No library, no build step: the page's CSP allows only these files.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { q: "", tubesAfter: "", functionsAfter: "", source: null, role: "nobody",
                snap: null, tubesTrail: [], functionsTrail: [] };
const LIMIT = 50;

// -- talking to the server -------------------------------------------------------------------
async function api(method, path, body) {
  const headers = { "X-Zstalk-Action": "1" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, credentials: "same-origin",
                                       body: body === undefined ? undefined : JSON.stringify(body) });
  let doc = {};
  try { doc = await response.json(); } catch (e) { doc = {}; }
  return [response.status, doc];
}

function say(text, bad) {
  const said = $("said");
  said.textContent = text;
  said.classList.toggle("bad", Boolean(bad));
}

async function act(what, method, path, body) {
  const [status, doc] = await api(method, path, body);
  if (status >= 400) say(`${what}: ${status} ${doc.error || ""} ${doc.message || ""}`, true);
  else say(`${what}: done`);
  return [status, doc];
}

const named = (kind, name) => `/v1/${kind}/${encodeURIComponent(name)}`;

// -- log-in ----------------------------------------------------------------------------------
async function start() {
  const [status, session] = await api("GET", "/ui/session");
  state.role = status === 200 ? session.role : "nobody";
  const keyed = status !== 200 || session.keyed;
  $("role").textContent = state.role === "nobody" ? "" :
    (keyed ? `logged in: ${state.role}` : "no master key: this machine only");
  $("logout").hidden = !keyed || state.role === "nobody";
  $("login").hidden = state.role !== "nobody";
  $("board").hidden = state.role === "nobody";
  $("peek-section").hidden = true;          // (a peek's bodies are not left for the next role)
  for (const id of ["tubes", "counters", "peers", "functions", "schedules"]) {
    $(id).tBodies[0].replaceChildren();     // (rows are made again: with this role's buttons)
  }
  if (state.role === "nobody") {
    if (state.source) state.source.close();
    $("live").textContent = "logged out";
    $("key").focus();
  } else {
    connect();
  }
}

async function login(event) {
  event.preventDefault();
  const [status, doc] = await api("POST", "/ui/login", { key: $("key").value });
  $("key").value = "";
  $("login-said").textContent = status === 200 ? "" : (doc.message || `refused: ${status}`);
  if (status === 200) start();
}

async function logout() {
  await api("POST", "/ui/logout");
  start();
}

// -- the live stream -------------------------------------------------------------------------
function connect() {
  if (state.source) state.source.close();
  const query = new URLSearchParams({ q: state.q, limit: LIMIT, tubesAfter: state.tubesAfter,
                                      functionsAfter: state.functionsAfter });
  const source = new EventSource(`/v1/dashboard/events?${query}`);
  state.source = source;
  source.addEventListener("snapshot", (event) => {
    $("live").textContent = `live ${new Date().toLocaleTimeString()}`;
    $("live").classList.add("on");
    render(JSON.parse(event.data));
  });
  source.addEventListener("problem", (event) => {
    const doc = JSON.parse(event.data);
    say(`the broker: ${doc.error} ${doc.message}`, true);
  });
  source.onerror = () => {
    $("live").textContent = "reconnecting…";
    $("live").classList.remove("on");
  };
}

// -- tables ----------------------------------------------------------------------------------
function button(label, onclick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onclick);
  return b;
}

// Fill tbody with a row per item, by name: columns give each cell (text, or a node);
// `actions(tr, td)` adds a new row's buttons (it reads the row's item as tr.item when
// clicked; a viewer is given only those that look: `master` says whether acting is shown).
function fill(tbody, items, columns, actions) {
  const rows = new Map([...tbody.rows].map((tr) => [tr.dataset.name, tr]));
  const kept = items.map((item) => {
    let tr = rows.get(item.name);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.name = item.name;
      columns.forEach(() => tr.append(document.createElement("td")));
      if (actions) {
        const td = document.createElement("td");
        td.className = "acts";
        actions(tr, td, state.role === "master");
        tr.append(td);
      }
    }
    tr.item = item;
    columns.forEach((column, i) => {
      const value = column(item);
      if (value instanceof Node) tr.cells[i].replaceChildren(value);
      else if (tr.cells[i].textContent !== String(value)) tr.cells[i].textContent = value;
    });
    return tr;
  });
  tbody.replaceChildren(...kept);
}

const show = (value) => (value === undefined || value === null || value === "" ? "-" : String(value));
const yes = (value) => (value ? "yes" : "-");
const ms = (value) => (value === undefined || value === null ? "-" : seconds(value / 1000));

function seconds(s) {
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function spark(values) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", `0 0 ${Math.max(values.length - 1, 1)} 20`);
  svg.setAttribute("preserveAspectRatio", "none");
  const top = Math.max(1, ...values);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", values.map((v, i) => `${i},${(19 - (v / top) * 18).toFixed(1)}`).join(" "));
  svg.append(line);
  const title = document.createElementNS(ns, "title");
  title.textContent = `puts a second, the last ${values.length} s (most ${top})`;
  svg.append(title);
  return svg;
}

function render(snap) {
  state.snap = snap;
  fill($("tubes").tBodies[0], snap.tubes, [
    (t) => t.name, (t) => t.currentJobsReady, (t) => t.currentJobsReserved,
    (t) => t.currentJobsDelayed, (t) => t.currentJobsBuried, (t) => t.totalJobs,
    (t) => t.putRate, (t) => spark(t.puts), (t) => (t.currentJobsReady ? ms(t.oldestReadyAgeMs) : "-"),
    (t) => (t.paused ? `${t.pauseTimeLeft} s left` : "-"),
  ], tubeActions);
  $("tubes-count").textContent = snap.tubesNext === null && !state.tubesAfter
    ? `(${snap.tubes.length})` : `(${snap.tubes.length} on this page)`;
  $("tubes-next").disabled = snap.tubesNext === null;
  $("tubes-first").disabled = !state.tubesAfter;
  fill($("counters").tBodies[0], snap.counters, [(c) => c.name, (c) => c.current, (c) => c.max]);
  const peers = snap.peers.map((p) => ({ ...p, name: `${p.kind} ${p.pid} ${p.frontId}` }));
  fill($("peers").tBodies[0], peers, [
    (p) => `${p.kind} ${p.pid}`, (p) => p.sessions, (p) => free(p), (p) => show(p.reserved),
    (p) => (p.tubes ? p.tubes.join(" ") : "-"), (p) => seconds(p.lastSeenMs / 1000),
  ]);
  $("functions-section").hidden = snap.functions === null;
  $("schedules-section").hidden = snap.schedules === null;
  if (snap.functions !== null) {
    fill($("functions").tBodies[0], snap.functions, [
      (f) => f.name, (f) => f.queued, (f) => f.running, (f) => f.delayed, (f) => show(f.startRate),
      (f) => ms(f.waitTime), (f) => ms(f.oldestQueuedAgeMs), (f) => limits(f),
      (f) => (f.waitingOnline === undefined ? "-" : `${f.waitingOnline} waiting, ${f.admitted} admitted`),
      (f) => (f.paused ? "yes" : f.pausedUntil ? `until ${f.pausedUntil}` : "-"),
      (f) => upstream(f),
    ], pauseActions("functions", "function"));
    $("functions-next").disabled = snap.functionsNext === null;
    $("functions-first").disabled = !state.functionsAfter;
  }
  if (snap.schedules !== null) {
    fill($("schedules").tBodies[0], snap.schedules, [
      (s) => s.name, (s) => s.cron, (s) => s.function, (s) => show(s.nextFireAt), (s) => yes(s.paused),
    ], pauseActions("schedules", "schedule"));
  }
}

// What a peer can take now: a pool's credits (jobs), a dispatcher's free slots (calls).
function free(p) {
  if (p.credits !== undefined) return `${p.credits} credits`;
  if (p.slots !== undefined) return p.stopping ? "stopping" : `${p.slots} slots`;
  return "-";
}

function limits(f) {
  const said = [];
  if (f.concurrency) said.push(`${f.concurrency} at once`);
  if (f.rate) said.push(f.rate);
  if (f.groups) said.push(`${f.groups.count} groups`);
  return said.length ? said.join(", ") : "-";
}

// An upstream's servers that take calls now or soon (not failed, unhealthy, down or
// draining), with why the others do not in the cell's title (their health check's error).
const TAKING = new Set(["usable", "full", "paused"]);

function upstream(f) {
  if (!f.servers) return f.upstream ? f.upstream : "-";
  const up = f.servers.filter((s) => TAKING.has(s.state)).length;
  const span = document.createElement("span");
  span.textContent = `${f.upstream}: ${up}/${f.servers.length} up`;
  span.title = f.servers.filter((s) => !TAKING.has(s.state))
    .map((s) => `${s.url} ${s.state}${s.health && s.health.error ? `: ${s.health.error}` : ""}`)
    .join("\n");
  return span;
}

function tubeActions(tr, td, master) {
  td.append(button("peek", () => peek(tr.item.name)));
  if (!master) return;
  td.append(button("kick", () => act(`kick ${tr.item.name}`, "POST",
                                     `${named("tubes", tr.item.name)}/kick`, { bound: 1000 })));
  td.append(button("pause 60 s", () => act(`pause ${tr.item.name}`, "PATCH",
                                           named("tubes", tr.item.name), { pausedFor: 60 })));
  td.append(button("resume", () => act(`resume ${tr.item.name}`, "PATCH",
                                       named("tubes", tr.item.name), { pausedFor: 0 })));
}

function pauseActions(kind, one) {
  return (tr, td, master) => {
    if (!master) return;
    td.append(button("pause", () => act(`pause ${one} ${tr.item.name}`, "PATCH",
                                        named(kind, tr.item.name), { paused: true })));
    td.append(button("resume", () => act(`resume ${one} ${tr.item.name}`, "PATCH",
                                         named(kind, tr.item.name), { paused: false })));
  };
}

// -- looking one up --------------------------------------------------------------------------
function fields(dl, doc, skip) {
  dl.replaceChildren();
  for (const [key, value] of Object.entries(doc)) {
    if (skip.includes(key)) continue;
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
    dl.append(dt, dd);
  }
}

async function findTask(event) {
  event.preventDefault();
  const id = $("task-id").value.trim();
  const [status, doc] = await api("GET", named("tasks", id));
  const acts = $("task-acts");
  acts.replaceChildren();
  if (status !== 200) {
    fields($("task"), { error: `${status} ${doc.error || ""}`, message: doc.message || "" }, []);
    return;
  }
  const place = {};
  if (doc.waitNum !== undefined) place.place = `${doc.waitNum} in line`;
  if (doc.waitTime !== undefined) place.eta = `in ${ms(doc.waitTime)}`;
  fields($("task"), { ...place, ...doc }, []);
  if (state.role === "master") {
    acts.append(button("cancel", () => act(`cancel ${id}`, "DELETE", named("tasks", id))));
    acts.append(button("retry", () => act(`retry ${id}`, "POST", `${named("tasks", id)}/retry`)));
  }
}

const unbase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}

async function findJob(event) {
  event.preventDefault();
  const id = $("job-id").value.trim();
  const [status, doc] = await api("GET", named("jobs", id));
  const body = $("job-body");
  const acts = $("job-acts");
  body.textContent = "";
  acts.replaceChildren();
  if (status !== 200) {
    fields($("job"), { error: `${status} ${doc.error || ""}`, message: doc.message || "" }, []);
    return;
  }
  fields($("job"), doc, ["body", "bodyEncoding"]);
  if (doc.body !== undefined) {
    const text = doc.bodyEncoding === "base64" ? null : doc.body;
    const bytes = text === null ? unbase64(doc.body) : new TextEncoder().encode(text);
    body.textContent = text === null ? hex(bytes) : text;     // (text, never HTML)
    acts.append(button("as hex", () => { body.textContent = hex(bytes); }));
    if (text !== null) acts.append(button("as text", () => { body.textContent = text; }));
  }
  if (state.role === "master") {
    acts.append(button("delete", () => act(`delete job ${id}`, "DELETE", named("jobs", id))));
  }
}

// A tube's next ready, delayed and buried job (GET /v1/tubes/{tube}/peek): their bodies come
// only to the master key, shown as text (textContent) or as hex when they are not UTF-8.
async function peek(name) {
  const [status, doc] = await api("GET", `${named("tubes", name)}/peek`);
  $("peek-section").hidden = false;
  $("peek-tube").textContent = name;
  const tbody = $("peek").tBodies[0];
  tbody.replaceChildren();
  if (status !== 200) {
    say(`peek ${name}: ${status} ${doc.error || ""} ${doc.message || ""}`, true);
    return;
  }
  for (const kind of ["ready", "delayed", "buried"]) {
    const job = doc[kind];
    const tr = document.createElement("tr");
    tr.dataset.name = kind;
    const cells = job === null ? [kind, "-", "-", "-", "-", "none"]
      : [kind, job.id, job.pri, seconds(job.age), job.delayLeft ? seconds(job.delayLeft) : "-",
         job.body === undefined ? "(master key only)" : bodyText(job)];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;        // (text, never HTML)
      tr.append(td);
    }
    tbody.append(tr);
  }
}

function bodyText(job) {
  if (job.bodyEncoding !== "base64") return job.body;
  return hex(unbase64(job.body));
}

// -- paging and search -------------------------------------------------------------------------
function page(kind, next) {
  const after = `${kind}After`;
  const trail = state[`${kind}Trail`];
  if (next) {
    trail.push(state[after]);
    state[after] = state.snap[`${kind}Next`] || "";
  } else {
    trail.length = 0;
    state[after] = "";
  }
  connect();
}

let typing = null;
function search() {
  clearTimeout(typing);
  typing = setTimeout(() => {
    state.q = $("search").value;
    state.tubesAfter = state.functionsAfter = "";
    connect();
  }, 250);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("search").addEventListener("input", search);
  $("task-form").addEventListener("submit", findTask);
  $("job-form").addEventListener("submit", findJob);
  $("tubes-next").addEventListener("click", () => page("tubes", true));
  $("tubes-first").addEventListener("click", () => page("tubes", false));
  $("functions-next").addEventListener("click", () => page("functions", true));
  $("functions-first").addEventListener("click", () => page("functions", false));
  start();
});
