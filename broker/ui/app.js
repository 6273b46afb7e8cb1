// The delayd console: live statistics, the due-time histogram, the pending list with search,
// message detail with cancel and reschedule, topics and groups with dead letters and redrive.
// Plain ES modules, no build step; all data comes from the /v1 API (see docs/console.md).

import { api, ApiError, askToken, currentToken, forgetToken, query, seg } from "./api.js";
import { Histogram } from "./chart.js";
import {
  fmtBytes, fmtCount, fmtDuration, fmtRate, fmtRelative, fmtTime, fromLocalInput, toLocalInput,
} from "./format.js";

const $ = (id) => document.getElementById(id);
const PAGE = 100;
const STATS_EVERY_MS = 2000;
const LIST_EVERY_MS = 3000;
const CHART_EVERY_MS = 10000;
const ID_RE = /^[A-Za-z0-9]+-[0-9a-f]+$/;

const state = {
  topic: "", // "" = every topic
  range: null, // {from, to} picked on the chart
  cursor: null,
  shown: new Map(), // id -> listed message
  stats: null,
  last: null, // previous stats sample, for rates
  detail: null, // the message in the drawer
  deadGroup: null,
  extended: false, // "Load more" was used: the automatic refresh leaves the list alone
};

// ------------------------------------------------------------------------------------ helpers

function node(tag, text, cls) {
  const n = document.createElement(tag);
  if (text !== undefined && text !== null) n.textContent = text;
  if (cls) n.className = cls;
  return n;
}

let toastTimer = null;
function toast(text, isError = false) {
  const t = $("toast");
  t.textContent = text;
  t.classList.toggle("bad", isError);
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
}

function confirmDialog(title, text, yes = "Confirm") {
  const d = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  d.returnValue = "";
  d.showModal();
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
  });
}

function topicPath(topic, ...rest) {
  return ["/v1/topics", seg(topic), ...rest].join("/");
}

// ------------------------------------------------------------------------------------ stats

async function refreshStats() {
  let s;
  try {
    s = await api("GET", "/v1/stats");
  } catch (e) {
    $("live").classList.add("down");
    $("live").title = e instanceof ApiError && e.status === 403
      ? "this token may not read statistics (admin right)" : `stats: ${e.message}`;
    return;
  }
  $("live").classList.remove("down");
  $("live").title = "live";
  const now = performance.now();
  const prev = state.last;
  state.last = { at: now, produced: s.produced_total, delivered: s.delivered_total };
  state.stats = s;
  const rate = (key) => (prev ? ((state.last[key] - prev[key]) * 1000) / Math.max(1, now - prev.at) : null);
  const set = (name, text) => { document.querySelector(`[data-stat="${name}"]`).textContent = text; };
  set("scheduled", fmtCount(s.scheduled));
  set("produce_rate", fmtRate(rate("produced")));
  set("deliver_rate", fmtRate(rate("delivered")));
  set("produced_total", `${fmtCount(s.produced_total)} in all`);
  set("delivered_total", `${fmtCount(s.delivered_total)} in all`);
  set("cancelled_total", fmtCount(s.cancelled_total));
  const l = s.lateness_ms || {};
  set("lateness", `${fmtCount(l.p50)} · ${fmtCount(l.p99)} · ${fmtCount(l.max)}`);
  set("disk_bytes", fmtBytes(s.disk_bytes));
  drawTopics(s);
  drawGroups(s);
}

function drawTopics(s) {
  const body = $("topics").tBodies[0];
  body.replaceChildren();
  const names = Object.keys(s.topics || {}).sort();
  for (const name of names) {
    const t = s.topics[name];
    const tr = node("tr");
    const a = node("a", name);
    a.href = "#";
    a.addEventListener("click", (e) => { e.preventDefault(); pickTopic(name); });
    const td = node("td");
    td.append(a);
    tr.append(td, node("td", fmtCount(t.scheduled), "num"), node("td", fmtCount(t.produced_total), "num"),
      node("td", fmtCount(t.delivered_total), "num"), node("td", fmtCount(t.cancelled_total), "num"));
    body.append(tr);
  }
  const select = $("topic");
  const have = [...select.options].map((o) => o.value).slice(1);
  if (have.join("\n") !== names.join("\n")) {
    const keep = select.value;
    select.replaceChildren(node("option", "all topics"));
    select.options[0].value = "";
    for (const name of names) {
      const o = node("option", name);
      o.value = name;
      select.append(o);
    }
    select.value = names.includes(keep) ? keep : "";
  }
}

function drawGroups(s) {
  const body = $("groups").tBodies[0];
  body.replaceChildren();
  for (const key of Object.keys(s.groups || {}).sort()) {
    const g = s.groups[key];
    const [topic, ...rest] = key.split("/");
    const group = rest.join("/");
    const tr = node("tr");
    tr.dataset.group = key;
    const actions = node("td", null, "actions-cell");
    if (g.dead > 0) {
      const view = node("button", "Dead letters", "ghost small");
      view.type = "button";
      view.addEventListener("click", () => showDead(topic, group));
      const redrive = node("button", "Redrive", "small");
      redrive.type = "button";
      redrive.addEventListener("click", () => redriveGroup(topic, group, g.dead));
      actions.append(view, redrive);
    }
    tr.append(node("td", key), node("td", fmtCount(g.backlog), "num"), node("td", fmtCount(g.inflight), "num"),
      node("td", g.oldest_unacked_age_ms ? fmtDuration(g.oldest_unacked_age_ms) : "–", "num"),
      node("td", fmtCount(g.dead), g.dead ? "num bad" : "num"), actions);
    body.append(tr);
  }
}

async function redriveGroup(topic, group, dead) {
  const ok = await confirmDialog("Redrive dead letters?",
    `Re-queue all ${fmtCount(dead)} dead letter(s) of ${topic}/${group}: consumers of this group get them again.`,
    "Redrive");
  if (!ok) return false;
  try {
    const r = await api("POST", topicPath(topic, "subscriptions", seg(group), "dead", "redrive"), {});
    toast(`${fmtCount(r.redriven)} message(s) re-queued for ${topic}/${group}`);
  } catch (e) {
    toast(`redrive failed: ${e.message}`, true);
  }
  await refreshStats();
  return true;
}

async function showDead(topic, group) {
  const d = $("dead-dialog");
  $("dead-title").textContent = `Dead letters of ${topic}/${group}`;
  const body = $("dead").tBodies[0];
  body.replaceChildren();
  state.deadGroup = { topic, group };
  try {
    const r = await api("GET", topicPath(topic, "subscriptions", seg(group), "dead") + query({ limit: 1000 }));
    for (const m of r.messages) {
      const tr = node("tr");
      tr.append(node("td", m.id, "mono"), node("td", m.key || "–"), node("td", fmtCount(m.attempt), "num"),
        node("td", m.reason || "–"));
      body.append(tr);
    }
  } catch (e) {
    toast(`dead letters: ${e.message}`, true);
    return;
  }
  d.showModal();
}

// ------------------------------------------------------------------------------------ list

function listPath() {
  return state.topic ? topicPath(state.topic, "messages") : "/v1/messages";
}

let listGeneration = 0;

async function loadList(reset, auto = false) {
  if (reset) state.cursor = null;
  if (reset && !auto) state.extended = false;
  const generation = reset ? ++listGeneration : listGeneration;
  const err = $("list-error");
  const items = [];
  let cursor = state.cursor;
  // A page may stop early (the daemon bounds the work of one request): go on a few times.
  for (let round = 0; round < 10; round += 1) {
    let r;
    try {
      r = await api("GET", listPath() + query({ limit: PAGE, cursor, from: state.range?.from, to: state.range?.to }));
    } catch (e) {
      err.hidden = false;
      err.textContent = e instanceof ApiError && e.status === 403 && !state.topic
        ? "Listing every topic needs the admin right: pick a topic." : e.message;
      return;
    }
    if (generation !== listGeneration) return; // a newer listing replaced this one
    items.push(...r.messages);
    cursor = r.next_cursor;
    if (!cursor || items.length >= PAGE) break;
  }
  err.hidden = true;
  if (reset) {
    state.shown.clear();
    $("messages").tBodies[0].replaceChildren();
  }
  state.cursor = cursor;
  for (const m of items) addRow(m);
  $("more").hidden = !cursor;
  $("list-empty").hidden = state.shown.size > 0;
}

function addRow(m) {
  if (state.shown.has(m.id)) return;
  state.shown.set(m.id, m);
  const tr = node("tr");
  tr.dataset.id = m.id;
  tr.className = state.detail?.id === m.id ? "row sel" : "row";
  tr.append(node("td", fmtTime(m.deliver_at), "mono"), node("td", fmtRelative(m.deliver_at), "rel"),
    node("td", m.id, "mono"), node("td", m.topic), node("td", m.key ?? "–"), node("td", m.tag ?? "–"),
    node("td", fmtBytes(m.body_size), "num"));
  tr.addEventListener("click", () => openDetail(m.id));
  $("messages").tBodies[0].append(tr);
}

function pickTopic(name) {
  $("topic").value = name;
  state.topic = name;
  loadList(true);
}

function setRange(range) {
  state.range = range;
  const chip = $("range");
  chip.replaceChildren();
  if (range) {
    chip.dataset.from = range.from;
    chip.dataset.to = range.to;
    chip.append(node("span", `due ${fmtTime(range.from, true)} – ${fmtTime(range.to, true)}`));
    const x = node("button", "✕", "chip-x");
    x.type = "button";
    x.title = "show every due time";
    x.addEventListener("click", () => { setRange(null); loadList(true); });
    chip.append(x);
  }
  chip.hidden = !range;
}

async function search(text) {
  text = text.trim();
  if (!text) {
    loadList(true);
    return;
  }
  try {
    if (ID_RE.test(text)) {
      try {
        showDetail(await api("GET", `/v1/messages/${seg(text)}`));
        return;
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 404)) throw e;
        // not an id after all: a key can look like one
      }
    }
    if (!state.topic) await refreshStats(); // the topics to look in, as of now
    const topics = state.topic ? [state.topic] : Object.keys(state.stats?.topics || {}).slice(0, 100);
    const found = await Promise.all(topics.map((t) => api("GET", topicPath(t, "keys", seg(text))).catch((e) => {
      if (e instanceof ApiError && e.status === 404) return null;
      throw e;
    })));
    const hits = found.filter(Boolean);
    if (!hits.length) {
      toast(`no message with id "${text}", nor a pending one with that key${state.topic ? ` in ${state.topic}` : ""}`,
        true);
      return;
    }
    showDetail(hits[0]);
    if (hits.length > 1) toast(`${hits.length} topics have a message with this key; showing ${hits[0].topic}`);
  } catch (e) {
    toast(e.message, true);
  }
}

// ------------------------------------------------------------------------------------ detail

async function openDetail(id) {
  try {
    showDetail(await api("GET", `/v1/messages/${seg(id)}`));
  } catch (e) {
    toast(e.status === 404 ? `no message ${id}` : e.message, true);
  }
}

function showDetail(m) {
  state.detail = m;
  const dl = $("detail-fields");
  dl.replaceChildren();
  const rows = [["id", m.id], ["state", m.state], ["topic", m.topic], ["key", m.key ?? "–"], ["tag", m.tag ?? "–"],
    ["due", `${fmtTime(m.deliver_at, true)} (${fmtRelative(m.deliver_at)})`],
    ["produced", fmtTime(m.produced_at, true)]];
  for (const [k, v] of Object.entries(m.headers || {})) rows.push([`header ${k}`, v]);
  for (const [k, v] of rows) {
    dl.append(node("dt", k), node("dd", v, k === "state" ? `state-${v}` : undefined));
  }
  $("detail-body").textContent = m.body !== undefined ? m.body : `base64: ${m.body_b64}`;
  const pending = m.state === "scheduled";
  $("detail-actions").hidden = !pending;
  if (pending) $("reschedule-at").value = toLocalInput(Math.max(m.deliver_at, Date.now() + 60000));
  $("detail").hidden = false;
  for (const tr of document.querySelectorAll("#messages tr.row")) tr.classList.toggle("sel", tr.dataset.id === m.id);
}

function closeDetail() {
  $("detail").hidden = true;
  state.detail = null;
  for (const tr of document.querySelectorAll("#messages tr.sel")) tr.classList.remove("sel");
}

async function cancelMessage() {
  const m = state.detail;
  if (!m) return;
  const ok = await confirmDialog("Cancel this message?",
    `${m.id}${m.key ? ` (key ${m.key})` : ""} in ${m.topic}, due ${fmtTime(m.deliver_at)}, will never be delivered.`,
    "Cancel message");
  if (!ok) return;
  try {
    await api("DELETE", `/v1/messages/${seg(m.id)}`);
    toast(`${m.id} cancelled`);
    closeDetail();
  } catch (e) {
    toast(e.code === "already_delivered" ? `${m.id} was already delivered` : e.message, true);
  }
  await Promise.all([loadList(true), refreshStats(), chart.refresh()]);
}

// Reschedule: a keyed message is replaced atomically (same key, `replace: true`); an unkeyed
// one is cancelled first, then produced again as a copy (so it can never be delivered twice;
// the copy gets a new id).
async function reschedule() {
  const m = state.detail;
  if (!m) return;
  const at = fromLocalInput($("reschedule-at").value);
  if (at === null) {
    toast("pick a new due time", true);
    return;
  }
  const how = m.key
    ? `It is replaced atomically by a copy with the same key (key ${m.key}), due ${fmtTime(at)}.`
    : `It has no key: it is cancelled, then a copy is produced due ${fmtTime(at)}, with a new id.`;
  if (!(await confirmDialog("Reschedule this message?", `${m.id} in ${m.topic}. ${how}`, "Reschedule"))) return;
  let current;
  try {
    current = await api("GET", `/v1/messages/${seg(m.id)}`);
  } catch (e) {
    toast(e.message, true);
    return;
  }
  if (current.state !== "scheduled") {
    toast(`${m.id} is ${current.state} now; not rescheduled`, true);
    showDetail(current);
    return;
  }
  const copy = { deliver_at: at };
  if (current.body !== undefined) copy.body = current.body;
  else copy.body_b64 = current.body_b64;
  if (current.tag) copy.tag = current.tag;
  if (current.headers && Object.keys(current.headers).length) copy.headers = current.headers;
  if (current.key) {
    copy.key = current.key;
    copy.replace = true;
  } else {
    try {
      await api("DELETE", `/v1/messages/${seg(m.id)}`);
    } catch (e) {
      toast(e.code === "already_delivered" ? `${m.id} was already delivered; not rescheduled` : e.message, true);
      return;
    }
  }
  for (;;) {
    try {
      const r = await api("POST", topicPath(current.topic, "messages"), copy);
      const id = r.messages[0].id;
      toast(`rescheduled: ${id} due ${fmtTime(at)}`);
      await Promise.all([loadList(true), refreshStats(), chart.refresh()]);
      await openDetail(id);
      return;
    } catch (e) {
      if (copy.replace) {
        toast(`not rescheduled: ${e.message}`, true);
        return;
      }
      // The original is cancelled already: do not lose the copy silently.
      const again = await confirmDialog("The copy was not stored",
        `${m.id} was cancelled, but producing its copy failed (${e.message}). Try again?`, "Try again");
      if (!again) return;
    }
  }
}

// ------------------------------------------------------------------------------------ start

const chart = new Histogram($("chart"), {
  load: async (from, to, step) => (await api("GET", "/v1/schedule" + query({ from, to, step_ms: step }))).buckets,
  onPick: (from, to) => { setRange({ from, to }); loadList(true); },
  onChange: (text) => { $("chart-caption").textContent = text; },
});

function wire() {
  for (const b of document.querySelectorAll("#zoom [data-span]")) {
    b.addEventListener("click", () => chart.setSpan(Number(b.dataset.span)));
  }
  $("pan-left").addEventListener("click", () => chart.pan(-0.5));
  $("pan-right").addEventListener("click", () => chart.pan(0.5));
  $("pan-now").addEventListener("click", () => chart.setSpan(chart.span));
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); search($("search").value); });
  $("topic").addEventListener("change", () => { state.topic = $("topic").value; loadList(true); });
  $("refresh").addEventListener("click", () => { loadList(true); refreshStats(); chart.refresh(); });
  $("more").addEventListener("click", () => { state.extended = true; loadList(false); });
  $("detail-close").addEventListener("click", closeDetail);
  $("cancel").addEventListener("click", cancelMessage);
  $("reschedule").addEventListener("click", reschedule);
  $("token-button").addEventListener("click", () => askToken(null).then(() => start()));
  $("token-forget").addEventListener("click", () => { forgetToken(); $("token-input").value = ""; });
  $("dead-redrive").addEventListener("click", async () => {
    const g = state.deadGroup;
    $("dead-dialog").close();
    if (g) await redriveGroup(g.topic, g.group, $("dead").tBodies[0].rows.length);
  });
}

async function start() {
  try {
    const info = await api("GET", "/v1/info");
    $("node").textContent = `node ${info.node_id} · v${info.version}${currentToken() ? " · token set" : ""}`;
  } catch (e) {
    $("node").textContent = e.message;
  }
  await Promise.all([refreshStats(), loadList(true), chart.refresh()]);
}

let started = false;
async function boot() {
  wire();
  await start();
  if (started) return;
  started = true;
  setInterval(refreshStats, STATS_EVERY_MS);
  setInterval(() => chart.refresh(), CHART_EVERY_MS);
  // The first page follows what is pending; pages loaded with "Load more" are left alone.
  setInterval(() => {
    if (!document.hidden && !state.extended && !$("confirm").open) loadList(true, true);
  }, LIST_EVERY_MS);
}

boot();
