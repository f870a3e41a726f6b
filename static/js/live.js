// The live annotation page: the sandbox screen over noVNC, the model's proposals drawn on the screenshot it saw,
// accept (click or keys 1-9) or override (validated by the server as you type), all without a page reload.
import RFB from "../vendor/novnc/core/rfb.js";
import { problem } from "./api_problem.js";

const root = document.getElementById("live");
const api = root.dataset.api; // /api/live/<id>/
const $ = (id) => document.getElementById(id);
let state = JSON.parse($("live-state").textContent);
const templates = JSON.parse($("live-templates").textContent);
let rfb = null;
let busy = false;
let stepEvent = null; // a step pushed while our own step request was in flight: its answer shows that step
const early = new Map(); // proposals that arrived before the step response that moved us to their index
// Timings the benchmark reads: accept → new screenshot shown; proposals sent by the server → drawn.
window.liveTimings = { steps: [], proposals: [] };

async function call(path, body) {
  const response = await fetch(api + path, {
    method: body === undefined ? "GET" : "POST",
    headers: { "Content-Type": "application/json", "X-CSRFToken": root.dataset.csrf },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(problem(data, response.status));
  return data;
}

function showError(message) { $("live-error").textContent = message || ""; }

// --- the live screen -----------------------------------------------------------------------------------------------

async function connectVnc() {
  if (rfb || state.status !== "active") return;
  if (state.kind !== "desktop") { // a browser sandbox is one headless page: its screenshots are the live screen
    $("vnc-state").textContent = "browser sandbox: the screenshot beside is the live screen";
    $("vnc").hidden = true; root.dataset.vnc = "none";
    return;
  }
  try {
    const { token, port } = await call("vnc-token/", {});
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    rfb = new RFB($("vnc"), `${scheme}://${location.hostname}:${port}/?token=${encodeURIComponent(token)}`);
    rfb.viewOnly = true; // the trajectory only records actions that go through accept/override
    rfb.scaleViewport = true;
    rfb.addEventListener("connect", () => { $("vnc-state").textContent = "connected"; root.dataset.vnc = "connected"; });
    rfb.addEventListener("disconnect", () => {
      $("vnc-state").textContent = "disconnected"; root.dataset.vnc = "disconnected"; rfb = null;
      if (state.status === "active") setTimeout(connectVnc, 2000);
    });
  } catch (error) {
    $("vnc-state").textContent = "unavailable: " + error.message;
  }
}

// --- proposals -----------------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function drawOverlay(points) {
  const svg = $("overlay");
  svg.setAttribute("viewBox", `0 0 ${state.model_width || 1} ${state.model_height || 1}`);
  svg.replaceChildren();
  const radius = Math.max(state.model_width, state.model_height) / 90;
  for (const { x, y, label, invalid } of points) {
    const g = document.createElementNS(SVG, "g");
    g.setAttribute("class", invalid ? "mark invalid" : "mark");
    const c = document.createElementNS(SVG, "circle");
    c.setAttribute("cx", x); c.setAttribute("cy", y); c.setAttribute("r", radius);
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", x + radius * 1.2); t.setAttribute("y", y - radius * 1.2);
    t.setAttribute("font-size", radius * 2); t.textContent = label;
    g.append(c, t); svg.append(g);
  }
}

// While the model thinks, how long it has been thinking (per step index), so a slow model is visibly slow.
let thinking = { index: -1, since: 0, timer: null };
function showThinking() {
  const labels = { pending: "the model is thinking…", failed: "failed", ready: "", none: "" };
  let text = labels[state.proposals] || "";
  if (state.proposals === "pending" && state.status === "active") {
    if (thinking.index !== state.next_index) thinking = { ...thinking, index: state.next_index, since: Date.now() };
    const seconds = Math.floor((Date.now() - thinking.since) / 1000);
    if (seconds >= 1) text = `the model is thinking… ${seconds} s`;
    if (!thinking.timer) thinking.timer = setInterval(showThinking, 1000);
  } else if (thinking.timer) {
    clearInterval(thinking.timer); thinking.timer = null;
  }
  $("proposal-state").textContent = text;
  $("retry").hidden = state.status !== "active";
}

function renderCandidates() {
  const list = $("candidates");
  list.replaceChildren();
  const marks = [];
  showThinking();
  $("switch-model").hidden = state.proposals !== "failed";
  if (state.proposals === "failed") showError("The model could not propose: " + state.proposal_error);
  state.candidates.forEach((c, i) => {
    const li = document.createElement("li");
    li.className = c.error ? "candidate invalid" : "candidate";
    li.dataset.index = i;
    const head = document.createElement("div");
    head.innerHTML = `<kbd>${i + 1}</kbd> `;
    const thought = document.createElement("span");
    thought.textContent = c.thought || "(no thought)";
    head.append(thought);
    if (i === 0 && root.dataset.greedyFirst === "1") {
      const best = document.createElement("span");
      best.className = "badge best"; best.textContent = "best guess";
      best.title = "The model's most likely answer (greedy decoding); the others are sampled alternatives.";
      head.append(" ", best);
    }
    const code = document.createElement("code");
    code.textContent = c.error ? c.raw : c.action_text;
    li.append(head, code);
    if (c.error) {
      const why = document.createElement("p");
      why.className = "error-text"; why.textContent = "Invalid, never run: " + c.error;
      li.append(why);
    } else {
      const accept = document.createElement("button");
      accept.type = "button"; accept.textContent = `Accept (${i + 1})`; accept.className = "accept";
      accept.addEventListener("click", () => acceptCandidate(i));
      const edit = document.createElement("button");
      edit.type = "button"; edit.textContent = "Edit"; edit.className = "secondary";
      edit.addEventListener("click", () => {
        $("override-thought").value = c.thought; $("override-action").value = c.action_text; validate();
      });
      li.append(accept, edit);
    }
    list.append(li);
    (c.points || []).forEach(([x, y]) => marks.push({ x, y, label: String(i + 1), invalid: !!c.error }));
  });
  drawOverlay(marks);
}

function applyState(next) {
  state = next;
  $("live-status").textContent = state.status;
  root.dataset.status = state.status;
  root.dataset.nextIndex = state.next_index;
  $("step-n").textContent = state.next_index + 1;
  if (state.observation_url && $("shot").dataset.observation !== state.observation_url) {
    showObservation(state.observation_url);
  }
  $("shot-placeholder").hidden = !!state.observation_url;
  if (!state.observation_url && state.status === "failed") $("shot-placeholder").textContent = "The desktop could not be started.";
  if (state.error) showError(state.error);
  const over = state.status === "ended" || state.status === "failed";
  $("deciding").hidden = over;
  if (over) {
    if (state.status === "ended") { showError(""); $("live-status").textContent = `ended (${state.end_reason})`; }
    $("live-ended").hidden = false;
    $("live-outcome").textContent = outcomeText(state);
    if (rfb) { rfb.disconnect(); }
  }
  if (early.has(state.next_index) && state.proposals === "pending") {
    Object.assign(state, early.get(state.next_index)); early.delete(state.next_index);
  }
  renderCandidates();
  if (state.proposals === "ready" || state.proposals === "failed") root.dataset.proposalsFor = state.next_index;
  const open = state.status === "active";
  document.querySelectorAll("#override button, #abandon").forEach((b) => { b.disabled = !open && b.id !== "abandon"; });
  $("abandon").disabled = !(state.status === "active" || state.status === "starting");
  if (open) connectVnc();
}

// Show an observation: its stored file by URL, or with `jpeg` (base64) the same bytes the step's answer carried,
// so the new screenshot needs no second request. Resolves once it is decoded (or failed).
function showObservation(url, jpeg) {
  const shot = $("shot");
  shot.dataset.observation = url;
  shot.src = jpeg ? `data:image/jpeg;base64,${jpeg}` : url;
  return shot.decode().catch(() => {});
}

// What the ended page says happened: the evaluator's verdict, or why there is none.
function outcomeText(s) {
  if (s.status === "failed") return "The session failed: " + (s.error || "unknown error") + ". Nothing more can be done here.";
  const why = { finished: "You finished the task.", fail: "You gave up: the task cannot be done here.",
    call_user: "The session ended asking for the user.", abandoned: "You abandoned the session; the steps so far are kept.",
    lease_lost: "The desktop was lost (its lease expired or it stopped); the steps so far are kept.",
    step_failed: "A step's result could not be recorded, so the session stopped there." }[s.end_reason] || `Ended (${s.end_reason}).`;
  const e = s.evaluation;
  if (!e) return why;
  if (e.status === "scored") return `${why} The task's evaluator scored it ${e.score} (${e.score >= 1 ? "success" : "not successful"}).`;
  return `${why} ${e.message}`;
}

function addStep(step) {
  const li = document.createElement("li");
  const code = document.createElement("code"); code.textContent = step.action_text;
  const badge = document.createElement("span"); badge.className = "badge";
  badge.textContent = step.source === "model" ? "Model (accepted)" : "Human";
  const thought = document.createElement("div"); thought.className = "muted"; thought.textContent = step.thought;
  li.append(code, " ", badge, thought);
  $("steps").append(li);
}

// --- deciding ------------------------------------------------------------------------------------------------------

async function takeStep(body) {
  if (busy || state.status !== "active") return;
  busy = true; showError("");
  const started = performance.now();
  const index = state.next_index;
  try {
    const answer = await call("step/?observation=inline", { expected_index: index, ...body });
    const { step, state: next } = answer;
    const answered = performance.now() - started;
    if (step.index >= $("steps").children.length) addStep(step);
    if (state.next_index <= index && next.observation_url && answer.observation_jpeg_base64) {
      showObservation(next.observation_url, answer.observation_jpeg_base64);
    }
    // The override ran: clear the editor, unless the annotator already started on the next action (the step's
    // websocket event can arrive before this response).
    if (body.action_text !== undefined && $("override-action").value === body.action_text) {
      $("override-thought").value = ""; $("override-action").value = ""; $("override-check").textContent = "";
    }
    if (state.next_index <= index) applyState(next);
    await $("shot").decode().catch(() => {}); // the new screenshot is on screen
    window.liveTimings.steps.push({ index, ms: performance.now() - started, answered_ms: answered });
  } catch (error) {
    showError(error.message);
  } finally {
    busy = false;
    if (stepEvent) { const data = stepEvent; stepEvent = null; onStepEvent(data); }
  }
}

function acceptCandidate(i) {
  const c = state.candidates[i];
  if (!c || c.error) return;
  takeStep({ candidate: i });
}

let validation = null;
async function validate() {
  const text = $("override-action").value;
  const out = $("override-check");
  if (!text.trim()) { out.textContent = ""; out.className = "check"; return null; }
  const mine = (validation = call("validate/", { action_text: text }));
  try {
    const result = await mine;
    if (mine !== validation) return result; // a newer keystroke is being checked: leave the display to it
    out.className = result.valid ? "check ok" : "check bad";
    out.textContent = result.valid
      ? "✓ " + result.action_text
      : result.errors.map((e) => (e.column ? `column ${e.column}: ` : "") + e.message).join("; ");
    if (result.valid) drawOverlay(result.points.map(([x, y]) => ({ x, y, label: "you" })));
    return result;
  } catch (error) {
    out.className = "check bad"; out.textContent = error.message;
    return null;
  }
}

let timer = null;
$("override-action").addEventListener("input", () => {
  $("override-check").className = "check"; $("override-check").textContent = "checking…"; // never a stale verdict
  clearTimeout(timer); timer = setTimeout(validate, 120);
});
$("override-action").addEventListener("keydown", (event) => {
  if (event.key !== "Tab") return;
  const field = event.target;
  const typed = field.value.trim();
  const match = templates.find((t) => typed && t.startsWith(typed) && t !== typed);
  if (match) { event.preventDefault(); field.value = match; validate(); }
});
$("override").addEventListener("submit", async (event) => {
  event.preventDefault();
  const result = await validate();
  if (!result || !result.valid) { showError("Fix the action first: " + $("override-check").textContent); return; }
  takeStep({ thought: $("override-thought").value, action_text: $("override-action").value });
});

// A click on the screenshot fills the coordinates (model-image pixels) into the action being written.
$("shot-wrap").addEventListener("click", (event) => {
  const img = $("shot");
  const box = img.getBoundingClientRect();
  const x = Math.round(((event.clientX - box.left) / box.width) * state.model_width);
  const y = Math.round(((event.clientY - box.top) / box.height) * state.model_height);
  const field = $("override-action");
  const click = templates.find((t) => t.startsWith("click(")); // the grammar's own template, from the server
  if (!field.value.trim()) field.value = click.replace("(x,y)", `(${x},${y})`);
  else if (field.value.includes("(x,y)")) field.value = field.value.replace("(x,y)", `(${x},${y})`);
  else field.value = field.value.replace(/\(\s*-?\d+(\.\d+)?\s*,\s*-?\d+(\.\d+)?\s*\)/, `(${x},${y})`);
  validate();
});

document.addEventListener("keydown", (event) => {
  const tag = (event.target.tagName || "").toLowerCase();
  if (tag === "input" || tag === "textarea" || event.ctrlKey || event.metaKey || event.altKey) return;
  if (/^[1-9]$/.test(event.key)) acceptCandidate(Number(event.key) - 1);
});

// finished()/fail() as the grammar writes them: content in single quotes with \\, \' and newlines escaped.
function quoted(text) { return text.replace(/\\/g, "\\\\").replace(/'/g, "\\'").replace(/\n/g, "\\n"); }

$("finish").addEventListener("submit", (event) => {
  event.preventDefault();
  const summary = $("finish-summary").value.trim();
  takeStep({ thought: summary ? `The task is done: ${summary}` : "The task is done.", action_text: `finished(content='${quoted(summary)}')` });
});
$("give-up").addEventListener("click", () => {
  if (!confirm("Give up? This records fail(): the task cannot be done here (OSWorld's infeasible).")) return;
  takeStep({ thought: "This task cannot be done here.", action_text: "fail()" });
});
$("retry").addEventListener("click", async () => {
  try { showError(""); applyState(await call("proposals/", {})); } catch (error) { showError(error.message); }
});
$("switch-model").addEventListener("click", async () => {
  try { showError(""); applyState(await call("proposals/", { switch_to_active: true })); } catch (error) { showError(error.message); }
});
$("larger").addEventListener("click", () => {
  const on = root.classList.toggle("larger");
  $("larger").setAttribute("aria-pressed", String(on));
  $("larger").textContent = on ? "Side by side" : "Larger screen";
});

$("abandon").addEventListener("click", async () => {
  if (!confirm("Abandon this session? The steps taken so far stay stored.")) return;
  try { applyState(await call("end/", { reason: "abandoned" })); } catch (error) { showError(error.message); }
});

// --- server push ---------------------------------------------------------------------------------------------------

function onStepEvent(data) {
  if (data.step.index >= $("steps").children.length) addStep(data.step);
  if (data.state.next_index > state.next_index) applyState(data.state);
}

let delay = 1000;
function connectEvents() {
  const url = root.dataset.wsUrl;
  const ws = new WebSocket(url.startsWith("ws") ? url : (location.protocol === "https:" ? "wss://" : "ws://") + location.host + url);
  const beat = setInterval(() => ws.readyState === 1 && ws.send(JSON.stringify({ type: "heartbeat" })), 60000);
  ws.onopen = () => { delay = 1000; root.dataset.events = "open"; };
  ws.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.event === "state") applyState(data.state);
    else if (data.event === "step") {
      if (busy) stepEvent = data; // our step's answer will show it, its screenshot inline
      else onStepEvent(data);
    } else if (data.event === "proposals" && data.index > state.next_index) {
      early.set(data.index, { candidates: data.candidates, proposals: data.error ? "failed" : "ready", proposal_error: data.error });
    } else if (data.event === "proposals" && data.index === state.next_index) {
      const received = Date.now();
      state.candidates = data.candidates; state.proposals = data.error ? "failed" : "ready";
      state.proposal_error = data.error;
      renderCandidates();
      window.liveTimings.proposals.push({ index: data.index, sent_at: data.sent_at, received, drawn: Date.now() });
      root.dataset.proposalsFor = data.index;
    }
  };
  ws.onclose = (event) => {
    clearInterval(beat); root.dataset.events = "closed";
    if (event.code !== 4401 && event.code !== 4404) setTimeout(connectEvents, (delay = Math.min(delay * 2, 30000)));
  };
}

$("shot").dataset.observation = $("shot").getAttribute("src") || ""; // the page came with it
applyState(state);
connectEvents();
