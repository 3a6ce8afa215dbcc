// The dashboard: a read-only single page over the Gateway's API. All text from the API is
// inserted as text (never as HTML): agents are untrusted and their messages are shown verbatim.
"use strict";

const KEY_STORE = "agl-dashboard-key";
const REFRESH_MS = 2000;
const STATES = ["queuing", "running", "succeeded", "failed"];
let refreshTimer = null;
let renderSeq = 0;

// --- small DOM helpers ------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmt = {
  num: (v, d = 3) => {
    if (v === null || v === undefined) return "–";
    const s = Number(v).toFixed(d);
    return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
  },
  int: (v) => (v === null || v === undefined ? "–" : String(v)),
  secs: (v) => (v === null || v === undefined ? "–" : v < 60 ? `${v.toFixed(1)} s` : `${(v / 60).toFixed(1)} min`),
  time: (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–"),
  json: (v) => (typeof v === "string" ? v : JSON.stringify(v, null, 2)),
};

function badge(state) {
  return h("span", { class: `badge ${state}`, "data-state": state }, state);
}

// --- the API, with the key ----------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path) {
  const key = sessionStorage.getItem(KEY_STORE) || "";
  const response = await fetch(path, { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized("the key was refused");
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return response.json();
}

// --- login ---------------------------------------------------------------------------------

function showLogin(message) {
  clearTimeout(refreshTimer);
  sessionStorage.removeItem(KEY_STORE);
  document.getElementById("page").replaceChildren();
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("live").textContent = "";
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("key").focus();
}

async function login(event) {
  event.preventDefault();
  const key = document.getElementById("key").value;
  sessionStorage.setItem(KEY_STORE, key);
  try {
    await api("/api/dashboard/overview");
  } catch (err) {
    showLogin(err instanceof Unauthorized ? "Wrong key: the Gateway refused it." : `The Gateway did not answer: ${err.message}`);
    return;
  }
  document.getElementById("key").value = "";
  document.getElementById("login").hidden = true;
  route();
}

// --- routing and live refresh -------------------------------------------------------------

function parseHash() {
  const [path, query] = (location.hash.slice(1) || "/overview").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "overview", arg: parts[1], params: new URLSearchParams(query || "") };
}

async function route() {
  clearTimeout(refreshTimer);
  if (!sessionStorage.getItem(KEY_STORE)) { showLogin(); return; }
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  const { page, arg, params } = parseHash();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === (page === "rollout" ? "rollouts" : page));
  const view = { overview: overviewPage, rollouts: rolloutsPage, rollout: rolloutPage, training: trainingPage }[page] || overviewPage;
  const seq = ++renderSeq;
  const tick = async () => {
    if (seq !== renderSeq) return;
    try {
      const node = await view(arg, params);
      if (seq !== renderSeq) return;
      const page = document.getElementById("page");
      if (node === null) { // the view updated its live part in place (inputs keep focus and text)
        document.getElementById("live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
        refreshTimer = setTimeout(tick, REFRESH_MS);
        return;
      }
      const keepFocus = document.activeElement && page.contains(document.activeElement) ? document.activeElement.id : null;
      page.replaceChildren(node);
      if (keepFocus && document.getElementById(keepFocus)) {
        const el = document.getElementById(keepFocus);
        el.focus();
        if (el.setSelectionRange && typeof el.value === "string") el.setSelectionRange(el.value.length, el.value.length);
      }
      document.getElementById("live").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (err instanceof Unauthorized) { showLogin("The Gateway refused the key."); return; }
      document.getElementById("live").textContent = `update failed: ${err.message}`;
    }
    if (seq !== renderSeq) return;
    if (view !== rolloutPage) refreshTimer = setTimeout(tick, REFRESH_MS);
    else if (!document.querySelector("#rollout-summary h2 [data-state='succeeded'], #rollout-summary h2 [data-state='failed']")) {
      refreshTimer = setTimeout(tick, REFRESH_MS * 2); // a finished rollout does not change any more
    } else {
      document.getElementById("live").textContent = "finished · not refreshing";
    }
  };
  await tick();
}

// --- overview ------------------------------------------------------------------------------

async function overviewPage() {
  const o = await api("/api/dashboard/overview");
  const counts = h("div", { class: "stats" },
    h("div", {}, h("div", { class: "stat", id: "count-total" }, o.total), h("div", { class: "stat-label" }, "rollouts")),
    STATES.map((s) => h("div", {},
      h("a", { class: "stat", id: `count-${s}`, href: `#/rollouts?state=${s}` }, o.counts[s] ?? 0),
      h("div", { class: "stat-label" }, s))));
  const p = o.proxy;
  const proxy = h("div", { class: "card", id: "proxy" }, h("h3", {}, "Model proxy"),
    h("div", { class: "stats" },
      h("div", {}, h("div", { class: "stat" }, p.paused ? badge("paused") : badge("ok")), h("div", { class: "stat-label" }, p.paused ? `paused${p.reason ? ": " + p.reason : ""}` : "serving")),
      h("div", {}, h("div", { class: "stat", id: "proxy-inflight" }, p.inflight), h("div", { class: "stat-label" }, "calls in flight"))));
  const rates = h("div", { class: "card" }, h("h3", {}, "Throughput (last minute)"),
    h("div", { class: "stats" },
      h("div", {}, h("div", { class: "stat", id: "rollouts-per-minute" }, fmt.num(o.rollouts_per_minute, 1)), h("div", { class: "stat-label" }, "rollouts finished / min")),
      h("div", {}, h("div", { class: "stat", id: "calls-per-second" }, o.calls_per_second === null ? "–" : fmt.num(o.calls_per_second, 2)), h("div", { class: "stat-label" }, "model calls / s"))));
  const models = h("div", { class: "card" }, h("h3", {}, "Model servers"),
    o.models.length === 0 ? h("p", { class: "muted" }, "No inference server is registered.") :
      h("table", { id: "models" }, h("thead", {}, h("tr", {}, h("th", {}, "model"), h("th", {}, "endpoint"), h("th", { class: "num" }, "version"))),
        h("tbody", {}, o.models.map((m) => h("tr", {}, h("td", {}, m.model), h("td", { class: "mono" }, m.endpoint), h("td", { class: "num" }, m.version))))));
  const failures = h("div", { class: "card" }, h("h3", {}, "Recent failures"),
    o.failures.length === 0 ? h("p", { class: "muted" }, "No failed rollout.") :
      h("table", { id: "failures" }, h("thead", {}, h("tr", {}, h("th", {}, "rollout"), h("th", {}, "data id"), h("th", {}, "when"), h("th", {}, "error"))),
        h("tbody", {}, o.failures.map((f) => h("tr", {},
          h("td", { class: "mono" }, h("a", { href: `#/rollout/${encodeURIComponent(f.rollout_id)}` }, f.rollout_id)),
          h("td", {}, f.data_id ?? "–"), h("td", {}, fmt.time(f.updated_at)),
          h("td", {}, h("pre", { class: "error" }, f.error_message || "(no message)")))))));
  return h("div", { id: "overview" },
    h("div", { class: "card" }, h("h3", {}, "Rollouts by state"), counts),
    h("div", { class: "grid" }, rates, proxy, models), failures);
}

// --- rollouts table ----------------------------------------------------------------------

const PAGE_SIZE = 25;

// Merge into the filters of the address bar (not of the page as it was drawn: a control of a
// page being redrawn must not bring back filters the user has changed since).
function setParams(changes) {
  const q = new URLSearchParams(parseHash().params);
  for (const [k, v] of Object.entries(changes)) { if (v) q.set(k, v); else q.delete(k); }
  if (!("offset" in changes)) q.delete("offset");
  location.hash = `#/rollouts${q.toString() ? "?" + q : ""}`;
}

async function rolloutsPage(_, params) {
  const state = params.get("state") || "";
  const split = params.get("split") || "all";
  const q = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const query = new URLSearchParams({ split, q, offset, limit: PAGE_SIZE });
  if (state) query.set("state", state);
  const page = await api(`/api/dashboard/rollouts?${query}`);
  const filters = h("div", { class: "filters" },
    h("select", { id: "filter-state", "aria-label": "state", onchange: (e) => setParams({ state: e.target.value }) },
      h("option", { value: "" }, "all states"), STATES.map((s) => h("option", { value: s, selected: s === state }, s))),
    h("select", { id: "filter-split", "aria-label": "train or val", onchange: (e) => setParams({ split: e.target.value === "all" ? "" : e.target.value }) },
      ["all", "train", "val"].map((s) => h("option", { value: s, selected: s === split }, s === "all" ? "train + val" : s))),
    h("input", { id: "search", type: "search", placeholder: "rollout id or data id", value: q, "aria-label": "search",
      onchange: (e) => setParams({ q: e.target.value.trim() }) }),
    h("span", { class: "muted", id: "rollouts-total" }, `${page.total} rollouts`));
  const existing = document.getElementById("rollouts");
  const table = rolloutsTable(page, offset);
  if (existing && existing.dataset.hash === location.hash) {
    document.getElementById("rollouts-body").replaceChildren(...table);
    document.getElementById("rollouts-total").textContent = `${page.total} rollouts`;
    return null;
  }
  return h("div", { class: "card", id: "rollouts", "data-hash": location.hash }, h("h2", {}, "Rollouts"), filters,
    h("div", { id: "rollouts-body" }, table));
}

function rolloutsTable(page, offset) {
  const rows = page.items.map((r) => h("tr", { "data-rollout": r.rollout_id },
    h("td", { class: "mono" }, h("a", { href: `#/rollout/${encodeURIComponent(r.rollout_id)}` }, r.rollout_id)),
    h("td", {}, r.data_id ?? "–"), h("td", {}, r.is_train ? "train" : "val"), h("td", {}, badge(r.state)),
    h("td", { class: "num" }, fmt.num(r.reward)), h("td", { class: "num" }, fmt.secs(r.duration)),
    h("td", { class: "num" }, r.attempts), h("td", { class: "num" }, r.model_calls), h("td", { class: "num" }, r.tokens)));
  const pager = h("div", { class: "pager" },
    h("button", { id: "prev", disabled: offset === 0, onclick: () => setParams({ offset: String(Math.max(0, offset - PAGE_SIZE)) }) }, "‹ newer"),
    h("span", { class: "muted" }, page.total ? `${offset + 1}–${Math.min(offset + PAGE_SIZE, page.total)} of ${page.total}` : "none"),
    h("button", { id: "next", disabled: offset + PAGE_SIZE >= page.total, onclick: () => setParams({ offset: String(offset + PAGE_SIZE) }) }, "older ›"));
  return [h("table", {}, h("thead", {}, h("tr", {}, ["id", "data id", "split", "state"].map((t) => h("th", {}, t)),
    ["reward", "duration", "attempts", "model calls", "tokens"].map((t) => h("th", { class: "num" }, t)))),
    h("tbody", {}, rows)), pager];
}

// --- one rollout --------------------------------------------------------------------------

function toolCalls(calls) {
  return (calls || []).map((c) => h("div", { class: "toolcall" },
    h("b", {}, "→ tool call "), h("code", {}, (c.function && c.function.name) || c.type || "?"),
    h("pre", {}, (c.function && c.function.arguments) || "")));
}

function content(c) {
  if (c === null || c === undefined) return null;
  if (Array.isArray(c)) return c.map((part) => h("pre", {}, part.text ?? JSON.stringify(part)));
  return h("pre", {}, fmt.json(c));
}

function message(m, cls) {
  const role = m.role || "?";
  return h("div", { class: `msg ${cls || role}` },
    h("div", { class: "role" }, role + (m.name ? ` (${m.name})` : "") + (m.tool_call_id ? ` · result of ${m.tool_call_id}` : "")),
    content(m.content), toolCalls(m.tool_calls));
}

function callCard(c, i) {
  const usage = c.usage || {};
  const head = h("div", { class: "call-head" },
    h("b", {}, `call ${i + 1}`), badge(c.status === "error" ? "error" : "ok"),
    h("span", {}, `HTTP ${c.http_status ?? "–"}`), h("span", {}, `${fmt.num(c.latency_ms, 1)} ms`),
    h("span", {}, `retries ${c.retries ?? 0}`),
    h("span", {}, `tokens ${usage.prompt_tokens ?? "–"} in / ${usage.completion_tokens ?? "–"} out`),
    h("span", {}, `model ${c.model ?? "–"} v${c.model_version ?? "–"}`), h("span", {}, c.mode || ""),
    c.stream ? h("span", {}, "streamed") : null, h("span", { class: "muted" }, fmt.time(c.timestamp)));
  const body = h("div", { class: "call-body" },
    c.tools && c.tools.length ? h("div", { class: "muted" }, "tools offered: ", c.tools.map((t) => (t.function && t.function.name) || t.type).join(", ")) : null,
    (c.messages || []).map((m) => message(m)),
    c.prompt !== null && c.prompt !== undefined ? h("div", { class: "msg user" }, h("div", { class: "role" }, "prompt"), content(c.prompt)) : null,
    c.answers.map((a) => a.message ? message(a.message, "answer") :
      h("div", { class: "msg answer" }, h("div", { class: "role" }, "completion"), content(a.text))),
    c.answers.length ? h("div", { class: "muted" }, `finish reason: ${c.answers.map((a) => a.finish_reason).join(", ")}`) : null,
    c.error ? h("pre", { class: "error" }, c.error) : null);
  return h("div", { class: "call", "data-call": i }, head, body);
}

function maskBar(mask) {
  const bar = h("div", { class: "mask", title: "green: trainable tokens, grey: context" });
  let i = 0;
  while (i < mask.length) {
    let j = i;
    while (j < mask.length && mask[j] === mask[i]) j++;
    bar.appendChild(h("span", { class: mask[i] ? "t" : "c", style: `flex:${j - i}` }));
    i = j;
  }
  return bar;
}

async function openRaw(rolloutId) {
  const key = sessionStorage.getItem(KEY_STORE) || "";
  const r = await fetch(`/api/rollouts/${encodeURIComponent(rolloutId)}/events`, { headers: { Authorization: `Bearer ${key}` } });
  const blob = new Blob([JSON.stringify(await r.json(), null, 2)], { type: "application/json" });
  window.open(URL.createObjectURL(blob), "_blank");
}

async function rolloutPage(id) {
  const d = await api(`/api/dashboard/rollouts/${encodeURIComponent(id)}`);
  const r = d.rollout, s = r.status;
  const summary = h("div", { class: "card", id: "rollout-summary" },
    h("h2", {}, "Rollout ", h("span", { class: "mono" }, r.rollout_id), " ", badge(s.state)),
    h("div", { class: "stats" },
      h("div", {}, h("div", { class: "stat", id: "reward" }, fmt.num(d.reward)), h("div", { class: "stat-label" }, "reward")),
      h("div", {}, h("div", { class: "stat" }, fmt.secs(d.duration)), h("div", { class: "stat-label" }, "duration")),
      h("div", {}, h("div", { class: "stat" }, d.calls.length), h("div", { class: "stat-label" }, "model calls")),
      h("div", {}, h("div", { class: "stat" }, r.is_train ? "train" : "val"), h("div", { class: "stat-label" }, `data id ${r.metadata.data_id ?? "–"}`))),
    s.error_message ? h("pre", { class: "error" }, s.error_message) : null,
    h("p", {}, h("a", { href: "#", id: "raw-events", onclick: (e) => { e.preventDefault(); openRaw(r.rollout_id); } }, "raw events (JSON)"),
      " · ", h("a", { href: "#/rollouts" }, "all rollouts")),
    h("h3", {}, "Input"), h("pre", {}, fmt.json(r.input)));
  const history = h("div", { class: "card" }, h("h3", {}, "Status history"),
    h("table", { id: "history" }, h("thead", {}, h("tr", {}, ["version", "state", "when", "attempt", "note"].map((t) => h("th", {}, t)))),
      h("tbody", {}, (d.history.length ? d.history : [{ state: s.state, version: s.version, at: s.updated_at, attempt_id: s.last_attempt_id, error_message: s.error_message }])
        .map((c) => h("tr", {}, h("td", {}, c.version), h("td", {}, badge(c.state)), h("td", {}, fmt.time(c.at)), h("td", { class: "mono" }, c.attempt_id ?? "–"), h("td", {}, c.error_message ?? ""))))),
    h("h3", {}, "Attempts"),
    d.attempts.length === 0 ? h("p", { class: "muted" }, "No attempt recorded anything yet.") :
      h("table", { id: "attempts" }, h("thead", {}, h("tr", {}, ["attempt", "events", "first event", "last event", "outcome"].map((t) => h("th", {}, t)))),
        h("tbody", {}, d.attempts.map((a) => h("tr", {}, h("td", { class: "mono" }, a.attempt_id), h("td", {}, a.n_events), h("td", {}, fmt.time(a.first_event_at)), h("td", {}, fmt.time(a.last_event_at)),
          h("td", { class: "outcome", title: a.outcome_detail ?? "" }, a.outcome ?? "–"))))));
  const rewards = d.rewards.map((e) => h("div", { class: "msg answer reward-event" }, h("div", { class: "role" }, `reward · ${fmt.time(e.timestamp)}`), h("pre", {}, fmt.json(e.data))));
  const conversation = h("div", { class: "card", id: "conversation" }, h("h3", {}, "Conversation (last attempt)"),
    d.calls.length === 0 ? h("p", { class: "muted" }, "No model call recorded.") : d.calls.map(callCard),
    d.other_events.map((e) => h("div", { class: "msg" }, h("div", { class: "role" }, e.event_type), h("pre", {}, fmt.json(e.data)))),
    rewards.length ? rewards : h("p", { class: "muted" }, "No reward reported."));
  const t = d.training;
  const training = h("div", { class: "card", id: "training-view" }, h("h3", {}, "Training view (trajectory aggregation)"),
    h("p", { class: "muted" }, `The rows the trainer core builds from these calls; reward ${fmt.num(t.reward)}. `,
      `${t.stats.n_calls} usable calls, ${t.stats.n_calls_error} failed, ${t.stats.n_calls_no_tokens} without token ids, ${t.stats.n_merge_mismatch} merge breaks.`),
    t.rows.length === 0 ? h("p", { class: "muted" }, "No training row: no usable call.") :
      h("table", { id: "training-rows" }, h("thead", {}, h("tr", {}, h("th", {}, "row"), h("th", {}, "calls"),
        ["prompt", "trainable", "context"].map((x) => h("th", { class: "num" }, x)), h("th", {}, "tokens"), h("th", {}, "versions"))),
        t.rows.map((row, i) => h("tbody", {},
          row.break_reason ? h("tr", { class: "break" }, h("td", { colspan: 7, class: "break-reason" }, `merge break before row ${i + 1}: ${row.break_reason}`)) : null,
          h("tr", { class: "row" },
            h("td", {}, i + 1), h("td", {}, `${row.turn_index + 1}–${row.turn_index + row.n_calls}`),
            h("td", { class: "num" }, row.prompt_tokens), h("td", { class: "num trainable" }, row.trainable_tokens), h("td", { class: "num context" }, row.context_tokens),
            h("td", {}, maskBar(row.response_mask)), h("td", {}, row.model_versions.join(", ") || "–"))))),
    h("div", { class: "legend" }, h("span", {}, h("span", { class: "sw", style: "background:#1f8a4c" }), "trainable (the policy's tokens)"),
      h("span", {}, h("span", { class: "sw", style: "background:#c9cfdc" }), "context (tool results, user turns: masked)")));
  return h("div", { id: "rollout" }, summary, h("div", { class: "cols" }, h("div", {}, conversation), h("div", {}, history, training)));
}

// --- training -----------------------------------------------------------------------------

// A run with several policies (docs/policies.md) logs each policy's metrics under policy/NAME/:
// one curve per policy in the same chart.
const PER_POLICY = "(?:policy\\/[^/]+\\/)?";
const CHARTS = [
  { title: "Reward", match: new RegExp(`^${PER_POLICY}training\\/reward$`) },
  { title: "Validation reward", match: new RegExp(`^${PER_POLICY}val\\/reward$`) },
  { title: "Staleness (policy versions)", match: new RegExp(`^${PER_POLICY}training\\/staleness\\/(mean|max)$`) },
  { title: "KL", match: new RegExp(`^${PER_POLICY}actor\\/.*kl`) },
  { title: "Entropy", match: new RegExp(`^${PER_POLICY}actor\\/.*entropy`) },
  { title: "Clip fraction", match: new RegExp(`^${PER_POLICY}actor\\/.*clipfrac`) },
  { title: "Step time (s)", keys: ["timing/step_s"] },
];

async function trainingPage(_, params) {
  const runs = await api("/api/runs");
  if (runs.length === 0) {
    return h("div", { class: "card", id: "training" }, h("h2", {}, "Training"),
      h("p", { class: "muted" }, "No run has posted metrics yet. The trainer posts each step's metrics to the Gateway (POST /api/runs/{run}/metrics)."));
  }
  const chosen = params.get("runs") ? params.get("runs").split(",") : runs.slice(0, 4).map((r) => r.run_id);
  const data = await Promise.all(chosen.filter((id) => runs.some((r) => r.run_id === id))
    .map(async (id) => ({ id, points: (await api(`/api/runs/${encodeURIComponent(id)}/metrics`)).points })));
  const toggle = (id, on) => {
    const next = on ? [...chosen, id] : chosen.filter((x) => x !== id);
    location.hash = `#/training?runs=${encodeURIComponent(next.join(","))}`;
  };
  const picker = h("div", { class: "runs" }, runs.map((r) => h("label", {},
    h("input", { type: "checkbox", checked: chosen.includes(r.run_id), onchange: (e) => toggle(r.run_id, e.target.checked) }),
    ` ${r.run_id} `, h("span", { class: "muted" }, `(step ${r.last_step ?? "–"}, ${r.n_points} points)`))));
  const charts = CHARTS.map((c) => {
    const series = [];
    for (const run of data) {
      const keys = c.keys || [...new Set(run.points.flatMap((p) => Object.keys(p.metrics)))].filter((k) => c.match.test(k)).sort();
      for (const key of keys) {
        const pts = run.points.filter((p) => key in p.metrics).map((p) => [p.step, p.metrics[key]]);
        if (pts.length) series.push({ label: `${run.id} · ${key}`, points: pts });
      }
    }
    series.forEach((s, i) => { s.color = aglCharts.PALETTE[i % aglCharts.PALETTE.length]; });
    return h("div", { class: "card chart", "data-chart": c.title },
      h("h3", {}, c.title), aglCharts.lineChart(series, { title: c.title }),
      h("div", { class: "legend" }, series.map((s) => h("span", {}, h("span", { class: "sw", style: `background:${s.color}` }), s.label))));
  });
  return h("div", { id: "training" }, h("div", { class: "card" }, h("h2", {}, "Training runs"), picker), h("div", { class: "grid" }, charts));
}

// --- start ----------------------------------------------------------------------------------

// A link of the form /ui/#key=KEY (the demo prints one) logs in at once; the fragment never
// reaches the server, and it is removed from the address bar.
if (location.hash.startsWith("#key=")) {
  sessionStorage.setItem(KEY_STORE, decodeURIComponent(location.hash.slice(5)));
  history.replaceState(null, "", `${location.pathname}#/overview`);
}
document.getElementById("login").addEventListener("submit", login);
document.getElementById("logout").addEventListener("click", () => showLogin());
window.addEventListener("hashchange", route);
route();
