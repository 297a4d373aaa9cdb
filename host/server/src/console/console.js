// The console (served as /console.js): one page over the API.
"use strict";
// Everything the API returns is put on the page as text (textContent), never as HTML.
const main = document.getElementById("main");
let token = sessionStorage.getItem("stephost-token") || "";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
// What the person just did, kept above the page until they go elsewhere (a
// live update may redraw the page, and the card they acted on, meanwhile).
let flash = null;
window.addEventListener("hashchange", () => { flash = null; });

// Whether a form on the page has input not yet sent, and whether a live
// update was held back for it.
let editing = false, stale = false;
main.addEventListener("input", () => { editing = true; });
main.addEventListener("change", () => { editing = true; });

// Replaces the page's content; children as `el` takes them (arrays, nulls).
// A live update's render that finds a form being filled in leaves the page
// as it is (it was started before the person began typing).
function show(...children) {
  if (liveRender && editing) {
    stale = true;
    document.getElementById("live").textContent = "live (paused while you edit)";
    return;
  }
  editing = false;
  if (stale) { stale = false; document.getElementById("live").textContent = "live"; }
  const note = flash ? el("div", {class: "notice", role: "status"}, flash.text, " ",
    el("a", {href: `#/run/${encodeURIComponent(flash.runId)}`}, `Open run ${flash.runId}`)) : null;
  main.replaceChildren(...[note, children].flat(3).filter(c => c !== null && c !== undefined && c !== false));
}
const time = ms => ms ? new Date(ms).toLocaleString() : "";
const age = ms => ms < 1000 ? `${ms} ms` : ms < 60000 ? `${(ms/1000).toFixed(1)} s` : ms < 3600000 ? `${Math.round(ms/60000)} min` : `${(ms/3600000).toFixed(1)} h`;
const status = s => el("span", {class: `status s-${s}`}, s);
const pretty = text => { try { return JSON.stringify(typeof text === "string" ? JSON.parse(text) : text, null, 2); } catch { return String(text); } };

class ApiError extends Error { constructor(status, body) { super(body.message || `HTTP ${status}`); this.status = status; this.body = body; } }

async function api(path, options = {}) {
  const headers = Object.assign({"Accept": "application/json"}, options.body ? {"Content-Type": "application/json"} : {});
  if (token) headers["Authorization"] = `Bearer ${token}`;
  const r = await fetch(path, Object.assign({}, options, {headers}));
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

function showError(e) {
  if (e instanceof ApiError && e.status === 401) return login();
  const box = el("div", {class: "error", role: "alert"}, e.message, e.body && e.body.fix ? el("div", {}, "What to do: ", e.body.fix) : null);
  main.prepend(box);
}

function login() {
  show(el("h2", {}, "Sign in"),
    el("p", {}, "This server needs an API token (from STEPHOST_API_TOKENS). It is kept in this tab only."),
    el("form", {onsubmit: ev => { ev.preventDefault(); token = ev.target.token.value.trim(); sessionStorage.setItem("stephost-token", token); connect(); route(); }},
      el("div", {class: "row"},
        el("label", {}, "Token", el("input", {name: "token", type: "password", required: true, autocomplete: "off", size: 40})),
        el("button", {type: "submit"}, "Sign in"))));
  main.querySelector("input").focus();
}

// ---- runs list
async function runsView(params) {
  const q = new URLSearchParams(params);
  if (!q.get("limit")) q.set("limit", "50");
  const [summary, page] = await Promise.all([api("/api/summary"), api(`/api/runs?${q}`)]);
  const counts = el("div", {class: "counts", "aria-label": "Runs by status"},
    Object.entries(summary.counts).map(([s, n]) => el("div", {}, status(s), " ", n)),
    el("div", {}, "oldest runnable ", age(summary.oldest_runnable_age_ms)),
    el("div", {}, "oldest waiting ", age(summary.oldest_waiting_age_ms)));
  const field = (name, label, attrs = {}) => el("label", {}, label, el("input", Object.assign({name, value: params[name] || ""}, attrs)));
  const filters = el("form", {class: "filters", role: "search", onsubmit: ev => {
      ev.preventDefault();
      const f = new FormData(ev.target), p = new URLSearchParams();
      for (const [k, v] of f) if (v) p.set(k, k.endsWith("_ms") ? String(new Date(v).getTime()) : v);
      location.hash = `#/runs?${p}`;
    }},
    el("label", {}, "Status", el("select", {name: "status", "aria-label": "Status"}, el("option", {value: ""}, "any"),
      Object.keys(summary.counts).map(s => el("option", {value: s, selected: params.status === s}, s)))),
    field("module", "Module digest", {size: 20}),
    field("step", "Step name@version", {size: 18}),
    el("label", {}, "Created after", el("input", {name: "created_after_ms", type: "datetime-local"})),
    el("label", {}, "Created before", el("input", {name: "created_before_ms", type: "datetime-local"})),
    el("button", {type: "submit"}, "Filter"),
    el("a", {href: "#/runs"}, "clear"));
  const rows = page.runs.map(r => el("tr", {},
    el("td", {}, el("a", {href: `#/run/${encodeURIComponent(r.run_id)}`, class: "mono"}, r.run_id)),
    el("td", {}, status(r.status)),
    el("td", {}, r.step || el("span", {class: "mono"}, r.module_digest.slice(0, 12))),
    el("td", {}, time(r.created_at_ms)),
    el("td", {}, time(r.updated_at_ms)),
    el("td", {}, r.error || "")));
  const table = rows.length ? el("table", {}, el("caption", {class: "visually-hidden"}, "Runs, newest first"),
      el("thead", {}, el("tr", {}, ["Run", "Status", "Step", "Created", "Changed", "Error"].map(h => el("th", {scope: "col"}, h)))),
      el("tbody", {}, rows))
    : el("p", {class: "empty"}, Object.keys(params).length ? "No runs match these filters." : "No runs yet. Submit one with `stephost submit` or POST /api/runs.");
  const more = page.next ? el("p", {}, el("a", {href: `#/runs?${new URLSearchParams(Object.assign({}, params, {after: page.next}))}`}, "Older runs →")) : null;
  show(el("h2", {}, "Runs"), counts, filters, table, more);
}

// ---- one run
// A model call read as the conversation it is: the messages this call
// added (a later turn records what is new since the turn before), and the
// answer with its tokens and cost. `call` is the whole call.
function conversation(call) {
  const parse = text => { try { return JSON.parse(text); } catch { return null; } };
  const req = parse(call.request) || {};
  const out = parse(call.outcome || "null");
  const answer = out && typeof out.ok === "string" ? parse(out.ok) : null;
  const part = p => p.type === "text" ? p.text
    : p.type === "tool_call" ? `calls ${p.name}(${p.arguments})`
    : p.type === "tool_result" ? `${p.name} ${p.is_error ? "failed" : "answered"}: ${p.content}`
    : JSON.stringify(p);
  const message = (role, parts) => el("div", {class: `msg msg-${role}`}, el("b", {}, role), el("pre", {}, parts.map(part).join("\n")));
  const usage = answer && answer.usage ? Object.values(answer.usage).reduce((a, b) => a + (Number(b) || 0), 0) : 0;
  return el("section", {class: "conversation", "aria-label": `Conversation of call #${call.seq}`},
    req.stephost_after ? el("p", {class: "muted"}, `(the ${req.stephost_after} message(s) before these are in the earlier model calls)`) : null,
    req.system ? message("system", [{type: "text", text: req.system}]) : null,
    (req.messages || []).map(m => message(m.role, m.content || [])),
    answer ? [message("answer", answer.content || []),
      el("p", {class: "muted"}, `stop: ${answer.stop}`, usage ? `; ${usage} tokens` : "",
        answer.cost ? `; $${(answer.cost.micro_usd / 1e6).toFixed(6)}` : "")]
      : el("p", {class: "muted"}, out && out.err ? `no answer: ${out.err.kind}: ${out.err.message}` : "no answer recorded yet"));
}

// A run and the runs below it, one nested list item a run.
function treeNode(n) {
  return el("li", {},
    el("a", {href: `#/run/${encodeURIComponent(n.run_id)}`, class: "mono"}, n.run_id), " ", status(n.status),
    n.join_set ? el("span", {class: "muted"}, ` set ${n.join_set}`, n.arrival ? `, ended #${n.arrival}` : "") : null,
    n.tokens_total ? el("span", {class: "muted"}, ` ${n.tokens_total} tokens`) : null,
    n.waits_for ? el("div", {class: "muted"}, "waits for ", n.waits_for) : null,
    n.error ? el("div", {class: "s-failed"}, n.error) : null,
    n.children.length ? el("ul", {}, n.children.map(treeNode)) : null);
}

// Cancelling a run and every run below it.
function cancelForm(runId) {
  const out = el("div", {role: "status"});
  const form = el("form", {"aria-label": "Cancel this run", onsubmit: async ev => {
    ev.preventDefault();
    if (!form.reportValidity()) return;
    const f = new FormData(form);
    try {
      const done = await api(`/api/runs/${encodeURIComponent(runId)}/cancel`, {method: "POST",
        body: JSON.stringify({by: f.get("by") || null, reason: f.get("reason") || null})});
      flash = {runId, text: `Cancelled ${done.cancelled.length} run(s), top down: a worker ends them; one running stops at its next call.`};
      route();
    } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, e.message)); }
  }},
    el("div", {class: "row"}, whoField(), el("label", {}, "Reason", el("input", {name: "reason"})),
      el("button", {type: "submit", class: "danger"}, "Cancel run and its tree")));
  return [form, out];
}

// A fork of the run from a call: the calls before it kept (and not paid
// again), the build given (or the run's own) going live from there.
function forkForm(runId) {
  const out = el("div", {role: "status"});
  const form = el("form", {"aria-label": "Fork this run", onsubmit: async ev => {
    ev.preventDefault();
    if (!form.reportValidity()) return;
    const f = new FormData(form);
    try {
      const made = await api(`/api/runs/${encodeURIComponent(runId)}/fork`, {method: "POST",
        body: JSON.stringify({at: Number(f.get("at")), module_digest: f.get("digest") || null})});
      flash = {runId: made.run_id, text: `Forked from call #${f.get("at")} as ${made.run_id}: a worker runs it from there.`};
      route();
    } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, e.message)); }
  }},
    el("div", {class: "row"},
      el("label", {}, "From call #", el("input", {name: "at", type: "number", min: 1, required: true, size: 6})),
      el("label", {}, "Build (module digest; empty: this run's)", el("input", {name: "digest", size: 40, autocomplete: "off"})),
      el("button", {type: "submit", class: "secondary"}, "Fork")));
  return [form, out];
}

async function runView(runId, params) {
  const from = Number(params.from_seq || 1);
  const [view, page, tree] = await Promise.all([
    api(`/api/runs/${encodeURIComponent(runId)}`),
    api(`/api/runs/${encodeURIComponent(runId)}/calls?from_seq=${from}&limit=200`),
    api(`/api/runs/${encodeURIComponent(runId)}/tree`)]);
  const r = view.run;
  // The call a divergence names ("call #N diverged"), marked in the timeline.
  const divergence = r.status === "diverged" ? /call #(\d+) diverged/.exec(r.error || "") : null;
  const divergedAt = divergence ? Number(divergence[1]) : null;
  // What the model calls on this page spent.
  const spent = page.calls.reduce((s, c) => ({tokens: s.tokens + (c.tokens || 0), cost: s.cost + (c.cost_micro_usd || 0)}), {tokens: 0, cost: 0});
  const facts = el("dl", {},
    el("dt", {}, "Status"), el("dd", {}, status(r.status)),
    el("dt", {}, "Step"), el("dd", {}, r.step || "-"),
    el("dt", {}, "Module"), el("dd", {class: "mono"}, r.module_digest),
    el("dt", {}, "Fence"), el("dd", {}, `${r.fence} (sent to receivers with each write as Stephost-Fence)`),
    el("dt", {}, "Owner"), el("dd", {}, r.owner ? `${r.owner}, lease until ${time(r.lease_until_ms)}` : "none"),
    el("dt", {}, "Created"), el("dd", {}, time(r.created_at_ms)),
    r.parent ? [el("dt", {}, "Started by"), el("dd", {}, el("a", {href: `#/run/${encodeURIComponent(r.parent.run_id)}`, class: "mono"}, r.parent.run_id),
      ` call #${r.parent.seq}, set ${r.parent.join_set}`, r.parent.detached ? " (detached)" : "")] : null,
    r.fork ? [el("dt", {}, "Forked from"), el("dd", {}, el("a", {href: `#/run/${encodeURIComponent(r.fork.run_id)}`, class: "mono"}, r.fork.run_id),
      ` at call #${r.fork.seq} (the calls before it are that run's)`)] : null,
    view.forks.length ? [el("dt", {}, "Forks"), el("dd", {}, view.forks.map(f => el("div", {},
      el("a", {href: `#/run/${encodeURIComponent(f.run_id)}`, class: "mono"}, f.run_id), ` from call #${f.at}, `, status(f.status))))] : null,
    r.cancel ? [el("dt", {}, "Cancelled"), el("dd", {}, `by ${r.cancel.by} at ${time(r.cancel.at_ms)}`, r.cancel.reason ? `: ${r.cancel.reason}` : "")] : null,
    spent.tokens ? [el("dt", {}, "Model tokens"), el("dd", {}, `${spent.tokens}`,
      spent.cost ? ` ($${(spent.cost / 1e6).toFixed(6)})` : "", page.next_seq || from > 1 ? " in the calls shown" : "")] : null,
    el("dt", {}, "Input"), el("dd", {}, el("pre", {}, pretty(r.input))),
    r.output ? [el("dt", {}, "Output"), el("dd", {}, el("pre", {}, pretty(r.output)))] : null,
    r.error ? [el("dt", {}, "Error"), el("dd", {class: "s-failed"}, r.error)] : null);
  // A call is performed live once, by the execution whose fence it is kept
  // under; an execution under a later fence replayed it. A run waiting for
  // a worker (no owner, not finished) has not been replayed since its last
  // decision yet.
  const executed = r.owner || ["completed", "failed", "diverged", "parked", "waiting"].includes(r.status);
  const replayed = c => executed && c.fence < r.fence;
  const calls = page.calls.map(c => {
    const body = (label, text, full, field) => {
      const pre = el("pre", {}, pretty(text));
      // The whole body is fetched with the token, into the same place.
      const whole = full ? el("button", {type: "button", class: "secondary", onclick: async () => {
        try {
          const call = await api(`/api/runs/${encodeURIComponent(runId)}/calls/${c.seq}`);
          pre.textContent = pretty(call[field]);
          whole.remove();
        } catch (e) { showError(e); }
      }}, `show all ${full} bytes`) : null;
      return el("details", {}, el("summary", {}, label, full ? " (cut)" : ""), pre, whole);
    };
    // A model call opens as its conversation, read whole.
    const chat = c.name === "models.chat" ? el("details", {ontoggle: async ev => {
      const box = ev.target;
      if (!box.open || box.dataset.loaded) return;
      box.dataset.loaded = "1";
      try {
        const whole = await api(`/api/runs/${encodeURIComponent(runId)}/calls/${c.seq}`);
        box.append(conversation(whole));
      } catch (e) { box.append(el("div", {class: "error"}, e.message)); }
    }}, el("summary", {}, "conversation")) : null;
    // Fills the fork form with this call, the first the fork makes live.
    const forkHere = el("button", {type: "button", class: "secondary", "aria-label": `Fork from call ${c.seq}`, onclick: () => {
      const at = main.querySelector("form[aria-label='Fork this run'] input[name=at]");
      at.value = c.seq;
      at.focus();
    }}, "fork here");
    return el("tr", {class: c.seq === divergedAt ? "diverged" : "", id: `call-${c.seq}`},
      el("td", {}, c.seq),
      el("td", {}, c.class),
      el("td", {}, el("div", {class: "mono"}, c.name), c.operation_id ? el("div", {class: "mono", title: "operation id (Idempotency-Key)"}, "op ", c.operation_id.slice(0, 16)) : null),
      el("td", {}, status(c.state), c.resolved_by ? el("div", {}, "by ", c.resolved_by) : null,
        c.seq === divergedAt ? el("div", {class: "s-failed"}, "diverged here") : null),
      el("td", {}, String(c.fence), el("div", {class: "muted"}, replayed(c) ? "replayed since" : "live")),
      el("td", {}, c.duration_ms === null || c.duration_ms === undefined ? "" : `${c.duration_ms} ms`,
        c.tokens ? el("div", {class: "muted"}, `${c.tokens} tokens`, c.cost_micro_usd ? `, $${(c.cost_micro_usd / 1e6).toFixed(6)}` : "") : null),
      el("td", {}, c.attempts.length ? el("ol", {}, c.attempts.map(a => el("li", {}, `${a.kind}: ${a.result}`, a.detail ? ` (${a.detail})` : ""))) : ""),
      el("td", {}, chat, body("request", c.request, c.truncated && c.request_bytes > c.request.length ? c.request_bytes : 0, "request"),
        c.outcome ? body("outcome", c.outcome, c.truncated && c.outcome_bytes > c.outcome.length ? c.outcome_bytes : 0, "outcome") : null),
      el("td", {}, forkHere));
  });
  const timeline = calls.length ? el("table", {}, el("caption", {class: "visually-hidden"}, "Call timeline"),
      el("thead", {}, el("tr", {}, ["#", "Class", "Call", "State", "Fence", "Took", "Attempts", "Bodies", "Fork"].map(h => el("th", {scope: "col"}, h)))),
      el("tbody", {}, calls))
    : el("p", {class: "empty"}, from > 1 ? "No calls from here on." : "The run has made no calls yet.");
  const nav = el("p", {}, from > 1 ? el("a", {href: `#/run/${encodeURIComponent(runId)}`}, "← first calls") : null, " ",
    page.next_seq ? el("a", {href: `#/run/${encodeURIComponent(runId)}?from_seq=${page.next_seq}`}, "later calls →") : null);
  const logs = view.logs.length ? el("pre", {}, view.logs.map(l => `${time(l.at_ms)} ${l.level}: ${l.message}`).join("\n")) : el("p", {class: "empty"}, "No log lines.");
  const replayOut = el("div", {role: "status"});
  const replay = el("button", {class: "secondary", type: "button", onclick: async () => {
    replayOut.replaceChildren("replaying…");
    try {
      const rep = await api(`/api/runs/${encodeURIComponent(runId)}/replay`, {method: "POST", body: "{}"});
      replayOut.replaceChildren(el("pre", {}, pretty(rep)));
    } catch (e) { replayOut.replaceChildren(el("div", {class: "error"}, e.message)); }
  }}, "Replay offline");
  const notices = view.notices.length ? el("ul", {}, view.notices.map(n => el("li", {}, `${n.event} → ${n.webhook}: ${n.state} after ${n.attempts} attempt(s)`, n.last_error ? ` (${n.last_error})` : ""))) : null;
  show(el("h2", {}, "Run ", el("span", {class: "mono"}, runId)), facts,
    el("div", {class: "row"}, replay, el("button", {type: "button", class: "secondary", onclick: async () => {
      // Fetched with the token, then saved as a file.
      try {
        const fixture = await api(`/api/runs/${encodeURIComponent(runId)}/export`);
        const url = URL.createObjectURL(new Blob([JSON.stringify(fixture, null, 2)], {type: "application/json"}));
        const link = el("a", {href: url, download: `${runId}.json`});
        document.body.append(link); link.click(); link.remove();
        setTimeout(() => URL.revokeObjectURL(url), 10000);
      } catch (e) { showError(e); }
    }}, "Export")), replayOut,
    tree.needs_a_person && tree.needs_a_person.length ? el("div", {class: "notice", role: "status"},
      "Waiting for a person in this tree: ", tree.needs_a_person.join("; "), " (see Approvals and Unknown calls)") : null,
    tree.children.length ? [el("h3", {}, "Runs below"), el("ul", {class: "tree", "aria-label": "Runs below"}, tree.children.map(treeNode))] : null,
    ["completed", "failed", "diverged", "cancelled"].includes(r.status) || r.cancel ? null : cancelForm(runId),
    el("h3", {}, "Fork"),
    el("p", {class: "muted"}, "A new run keeping the calls before the one given (their outcomes and operation ids: a write made again reaches its receiver as the same operation), with this build or another that makes those calls."),
    forkForm(runId),
    el("h3", {}, "Timeline"),
    el("p", {class: "muted"}, "Each call was performed live once, under the fence shown; an execution under a later fence replayed it from the ledger (\u201creplayed since\u201d) instead of performing it again."),
    nav, timeline,
    el("h3", {}, "Log"), logs,
    notices ? [el("h3", {}, "Notifications"), notices] : null);
}

// ---- approvals inbox
function whoField() { return el("label", {}, "Your name", el("input", {name: "by", autocomplete: "name", required: !token, placeholder: token ? "(the token's name is recorded)" : ""})); }

async function approvalsView() {
  const list = await api("/api/approvals");
  const cards = list.map(a => {
    const out = el("div", {role: "status"});
    const decide = verdict => async ev => {
      const form = ev.target.closest("form");
      if (!form.reportValidity()) return;
      const f = new FormData(form);
      try {
        await api(`/api/approvals/${encodeURIComponent(a.run_id)}/${a.seq}`, {method: "POST",
          body: JSON.stringify({verdict, details_sha256: a.details_sha256, note: f.get("note") || null, by: f.get("by") || null})});
        flash = {runId: a.run_id, text: `Call #${a.seq}: ${verdict} — a worker continues the run.`};
        route();
      } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, e.message)); }
    };
    return el("section", {class: "card", "aria-label": `Approval for run ${a.run_id}`},
      el("h3", {}, typeof a.subject === "string" ? a.subject : pretty(a.subject)),
      el("dl", {},
        el("dt", {}, "Run"), el("dd", {}, el("a", {href: `#/run/${encodeURIComponent(a.run_id)}`, class: "mono"}, a.run_id), ` call #${a.seq}`),
        el("dt", {}, "Asked"), el("dd", {}, time(a.asked_at_ms)),
        el("dt", {}, "Expires"), el("dd", {}, time(a.expires_at_ms)),
        el("dt", {}, "Details sha256"), el("dd", {class: "mono"}, a.details_sha256)),
      el("pre", {"aria-label": "Details"}, pretty(a.details)),
      el("form", {onsubmit: ev => ev.preventDefault()},
        el("div", {class: "row"}, whoField(), el("label", {}, "Note", el("input", {name: "note"})),
          el("button", {type: "button", onclick: decide("approved")}, "Approve"),
          el("button", {type: "button", class: "danger", onclick: decide("rejected")}, "Reject"))),
      out);
  });
  // Runs waiting for another system's callback: listed, not completed here
  // (the token that completes a promise is never shown).
  const promises = await api("/api/promises");
  const waits = promises.map(p => el("section", {class: "card", "aria-label": `Promise ${p.name} of run ${p.run_id}`},
    el("h3", {}, `Promise \u201c${p.name}\u201d`),
    el("dl", {},
      el("dt", {}, "Run"), el("dd", {}, el("a", {href: `#/run/${encodeURIComponent(p.run_id)}`, class: "mono"}, p.run_id), ` call #${p.seq}`),
      el("dt", {}, "Waiting since"), el("dd", {}, time(p.waiting_since_ms)),
      el("dt", {}, "Expires"), el("dd", {}, p.expires_at_ms == null ? "unknown" : time(p.expires_at_ms)))));
  show(el("h2", {}, "Approvals waiting"), cards.length ? cards : el("p", {class: "empty"}, "Nothing waits for an approval."),
    el("h2", {}, "Promises waiting"),
    el("p", {class: "muted"}, "Runs waiting for another system, which completes each promise with the token the run handed it (POST /api/promises/TOKEN)."),
    waits.length ? waits : el("p", {class: "empty"}, "No run waits for a promise."));
}

// ---- unknown calls
async function unknownView() {
  const list = await api("/api/unknown");
  const cards = list.map(u => {
    const out = el("div", {role: "status"});
    const form = el("form", {onsubmit: async ev => {
      ev.preventDefault();
      const f = new FormData(ev.target), outcome = f.get("outcome");
      const body = {outcome, by: f.get("by") || null};
      try {
        if (outcome === "succeeded") body.response = JSON.parse(f.get("detail") || "null");
        else body.message = f.get("detail");
      } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, `The receipt is not JSON: ${e.message}`)); return; }
      try {
        await api(`/api/unknown/${encodeURIComponent(u.run_id)}/${u.seq}`, {method: "POST", body: JSON.stringify(body)});
        flash = {runId: u.run_id, text: `Call #${u.seq}: resolved as ${outcome} — a worker continues the run.`};
        route();
      } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, e.message)); }
    }},
      el("fieldset", {}, el("legend", {}, "What happened at the receiver?"),
        el("label", {}, el("span", {}, el("input", {type: "radio", name: "outcome", value: "succeeded", required: true}), " It happened (give its receipt as JSON)")),
        el("label", {}, el("span", {}, el("input", {type: "radio", name: "outcome", value: "failed"}), " It did not happen (give the reason)"))),
      el("label", {}, "Receipt JSON or reason", el("textarea", {name: "detail", required: true})),
      el("div", {class: "row"}, whoField(), el("button", {type: "submit"}, "Resolve")));
    return el("section", {class: "card", "aria-label": `Unknown call ${u.seq} of run ${u.run_id}`},
      el("h3", {}, u.name),
      el("dl", {},
        el("dt", {}, "Run"), el("dd", {}, el("a", {href: `#/run/${encodeURIComponent(u.run_id)}`, class: "mono"}, u.run_id), ` call #${u.seq}`),
        el("dt", {}, "Operation id"), el("dd", {class: "mono"}, u.operation_id),
        el("dt", {}, "Started"), el("dd", {}, time(u.started_at_ms)),
        el("dt", {}, "Attempts"), el("dd", {}, u.attempts.map(a => `${a.kind}: ${a.result}${a.detail ? ` (${a.detail})` : ""}`).join("; ") || "none")),
      el("p", {}, "Ask the receiver about this operation id, then record what it says. Sent:"),
      el("pre", {"aria-label": "Request sent"}, pretty(u.request)), form, out);
  });
  show(el("h2", {}, "Calls whose outcome is unknown"), cards.length ? cards : el("p", {class: "empty"}, "No call's outcome is in doubt."));
}

// ---- schedules
async function schedulesView() {
  const list = await api("/api/schedules");
  const rows = list.map(sc => {
    const out = el("div", {role: "status"});
    const act = what => async () => {
      try {
        await api(`/api/schedules/${encodeURIComponent(sc.name)}/${what}`, {method: "POST"});
        route();
      } catch (e) { out.replaceChildren(el("div", {class: "error", role: "alert"}, e.message)); }
    };
    return el("section", {class: "card", "aria-label": `Schedule ${sc.name}`},
      el("h3", {}, sc.name, " ", el("span", {class: `status s-${sc.paused ? "waiting" : "running"}`}, sc.paused ? "paused" : "active")),
      el("dl", {},
        el("dt", {}, "Cron"), el("dd", {class: "mono"}, `${sc.cron} (${sc.timezone})`),
        el("dt", {}, "Build"), el("dd", {class: "mono"}, sc.step || sc.module_digest),
        el("dt", {}, "Overlap"), el("dd", {}, sc.overlap),
        el("dt", {}, "Catch-up"), el("dd", {}, age(sc.catch_up_ms)),
        el("dt", {}, "Next slot"), el("dd", {}, sc.paused || sc.next_at_ms >= 8.64e15 ? "none" : time(sc.next_at_ms)),
        el("dt", {}, "Last run"), el("dd", {}, sc.last_run_id ? el("a", {href: `#/run/${encodeURIComponent(sc.last_run_id)}`, class: "mono"}, sc.last_run_id) : "none yet")),
      el("pre", {"aria-label": "Input"}, pretty(sc.input)),
      el("div", {class: "row"}, sc.paused
        ? el("button", {type: "button", onclick: act("resume")}, "Resume")
        : el("button", {type: "button", class: "danger", onclick: act("pause")}, "Pause")),
      out);
  });
  show(el("h2", {}, "Schedules"),
    el("p", {class: "muted"}, "Each slot starts one run, named after the schedule and the slot, whichever worker fires it. Add one with stephost schedule add or POST /api/schedules."),
    rows.length ? rows : el("p", {class: "empty"}, "No schedule."));
}

// ---- routing and live updates
function parseHash() {
  const [path, query] = (location.hash.slice(1) || "/runs").split("?");
  return {parts: path.split("/").filter(Boolean), params: Object.fromEntries(new URLSearchParams(query || ""))};
}
// A render asked for while one is in progress runs after it. A render a
// live update asked for (`fromLive`) does not replace a page whose form the
// person has started filling in meanwhile (see `show`).
let rendering = false, again = false, againLive = true, liveRender = false;
async function route(fromLive = false) {
  if (rendering) { again = true; againLive = againLive && fromLive; return; }
  rendering = true;
  liveRender = fromLive;
  const {parts, params} = parseHash();
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.nav === parts[0]) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  try {
    if (parts[0] === "run" && parts[1]) await runView(decodeURIComponent(parts[1]), params);
    else if (parts[0] === "approvals") await approvalsView();
    else if (parts[0] === "unknown") await unknownView();
    else if (parts[0] === "schedules") await schedulesView();
    else await runsView(params);
    const s = await api("/api/summary");
    document.getElementById("n-approvals").textContent = s.approvals_waiting ? `(${s.approvals_waiting})` : "";
    document.getElementById("n-unknown").textContent = s.unknown_calls ? `(${s.unknown_calls})` : "";
  } catch (e) { showError(e); }
  rendering = false;
  if (again) { const live = againLive; again = false; againLive = true; route(live); }
}

// A model's answer streaming in (or what its call waits for), shown on its
// run's page above the timeline until the run's next change redraws the page
// with the recorded answer. Each event brings the text that came since the
// one before and where it begins in the answer (in characters): the pieces
// are put together here, for every run (the page may be opened mid-answer),
// the last few answers kept.
const answers = new Map();
const ANSWERS_KEPT = 16;
function answerSoFar(s) {
  const key = `${s.run_id}#${s.seq}`;
  const piece = Array.from(s.text);
  let a = answers.get(key);
  // The answer's start (or a retried attempt's), or the piece that follows
  // the ones put together: appended. Anything else means pieces were missed.
  if (!a || s.offset === 0 || s.offset !== a.chars) {
    a = {text: s.offset === 0 ? "" : "…", chars: s.offset};
  }
  answers.delete(key);
  answers.set(key, {text: a.text + s.text, chars: a.chars + piece.length});
  while (answers.size > ANSWERS_KEPT) answers.delete(answers.keys().next().value);
  return answers.get(key).text;
}
function streaming(event) {
  const data = event.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5).replace(/^ /, "")).join("\n");
  let s;
  try { s = JSON.parse(data); } catch { return; }
  const text = typeof s.text === "string" && Number.isInteger(s.offset) ? answerSoFar(s) : undefined;
  const parts = parseHash().parts;
  if (parts[0] !== "run" || decodeURIComponent(parts[1] || "") !== s.run_id) return;
  let box = document.getElementById("streaming");
  if (!box) {
    const timeline = Array.from(main.querySelectorAll("h3")).find(h => h.textContent === "Timeline");
    if (!timeline) return;
    box = el("section", {id: "streaming", "aria-live": "polite", "aria-label": "Model call in progress"},
      el("h3", {}, "Model call in progress"), el("p", {class: "muted"}), el("pre", {}));
    timeline.before(box);
  }
  if (s.waiting !== undefined) {
    box.querySelector("p").textContent = `call #${s.seq} waits for its model: ${s.waiting}`;
    return;
  }
  if (text === undefined) return;
  box.querySelector("p").textContent = `call #${s.seq}, not recorded until it is whole`;
  box.querySelector("pre").textContent = text;
}

// Server-sent events, read with fetch so the token goes in a header, not the URL.
let stream = null;
async function connect() {
  if (stream) stream.abort();
  stream = new AbortController();
  const live = document.getElementById("live");
  try {
    const r = await fetch("/api/events", {headers: token ? {"Authorization": `Bearer ${token}`} : {}, signal: stream.signal});
    if (!r.ok) { live.textContent = "live updates off"; return; }
    live.textContent = "live";
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (/^event: model$/m.test(event)) { streaming(event); continue; }
        if (!/^event: runs$/m.test(event)) continue;
        // A form someone has started filling in is not redrawn under them.
        if (editing) { live.textContent = "live (paused while you edit)"; stale = true; }
        else route(true);
      }
    }
  } catch (e) { if (e.name === "AbortError") return; }
  live.textContent = "reconnecting…";
  setTimeout(connect, 2000);
}

window.addEventListener("hashchange", () => route());
route();
connect();
