// The data lead's trajectory player: one screenshot at a time with its action drawn in the screenshot's own pixel
// frame, keyboard navigation (← → j k, space plays), a filmstrip, the step's reasoning and the model's proposals,
// the think-aloud audio with each step's span, and (for leads) step verdicts, edits previewed before saving, cuts.
import { problem } from "./api_problem.js";

const root = document.getElementById("player");
const data = JSON.parse(document.getElementById("player-data").textContent);
const steps = data.steps;
const screen = data.screen;
const editable = root.dataset.editable === "1";
const me = Number(root.dataset.user);
const $ = (id) => document.getElementById(id);
const shot = $("player-shot");
const overlay = $("player-overlay");
const frame = $("player-frame");
const SVG = "http://www.w3.org/2000/svg";
let at = 0;
let preview = null; // typed actions of the action being edited, drawn instead of the stored ones

async function post(path, fields) {
  const response = await fetch(root.dataset.base + path, {
    method: "POST",
    headers: { "X-CSRFToken": root.dataset.csrf, Accept: "application/json" },
    body: new URLSearchParams(fields),
    credentials: "same-origin",
  });
  const reply = await response.json().catch(() => ({ detail: `The server answered HTTP ${response.status}.` }));
  if (!response.ok) throw new Error(problem(reply, response.status));
  return reply;
}

function showError(message) {
  const line = $("player-error");
  if (!line) return;
  line.textContent = message || "";
  line.hidden = !message;
}

// --- drawing ----------------------------------------------------------------------------------------------------------

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.append(node);
  return node;
}

// The frame the overlay draws in: the screenshot's natural pixels (actions are in screen pixels: scaled to it).
function drawingFrame() {
  const w = shot.naturalWidth || screen.width;
  const h = shot.naturalHeight || screen.height;
  return { w, h, sx: w / screen.width, sy: h / screen.height, unit: Math.max(w, h) / 100 };
}

function label(g, x, y, text, f) {
  const t = el("text", { x, y, "font-size": f.unit * 1.6, class: "player-label" }, g);
  t.textContent = text;
  return t;
}

function badge(g, x, y, text, f, cls) {
  const b = el("g", { class: cls }, g);
  const t = el("text", { x: x + f.unit * 0.8, y: y + f.unit * 2, "font-size": f.unit * 1.8 }, b);
  t.textContent = text;
  const width = Math.max(text.length * f.unit * 1.05, f.unit * 4) + f.unit * 1.6;
  b.insertBefore(el("rect", { x, y, width, height: f.unit * 2.8, rx: f.unit * 0.6 }), t);
  return b;
}

function crosshair(g, px, py, f, name) {
  const r = f.unit * 1.4;
  const c = el("g", { class: `player-crosshair player-mark-${name}`, "data-x": px, "data-y": py }, g);
  el("circle", { cx: px, cy: py, r }, c);
  if (name === "left_double") el("circle", { cx: px, cy: py, r: r * 0.55 }, c);
  el("line", { x1: px - r * 2, y1: py, x2: px + r * 2, y2: py }, c);
  el("line", { x1: px, y1: py - r * 2, x2: px, y2: py + r * 2 }, c);
  label(c, px + r * 1.3, py - r * 1.3, name === "click" ? "click" : name.replace("_", " "), f);
}

function arrow(g, x1, y1, x2, y2, cls) {
  const a = el("g", { class: cls }, g);
  el("line", { x1, y1, x2, y2, "marker-end": "url(#player-arrowhead)" }, a);
  return a;
}

function drawAction(g, action, f, n) {
  const P = (p) => [p[0] * f.sx, p[1] * f.sy];
  const type = action.type;
  if (action.point && type !== "scroll") {
    const [x, y] = P(action.point);
    crosshair(g, x, y, f, type);
  } else if (type === "drag") {
    const [x1, y1] = P(action.start);
    const [x2, y2] = P(action.end);
    const d = arrow(g, x1, y1, x2, y2, "player-drag player-mark-drag");
    el("circle", { cx: x1, cy: y1, r: f.unit }, d);
    el("circle", { cx: x2, cy: y2, r: f.unit * 0.6 }, d);
    label(d, x1 + f.unit * 1.4, y1 - f.unit * 1.4, "drag", f);
  } else if (type === "scroll") {
    const [x, y] = action.point ? P(action.point) : [f.w / 2, f.h / 2];
    const len = Math.min(f.w, f.h) * 0.15;
    const [dx, dy] = { up: [0, -1], down: [0, 1], left: [-1, 0], right: [1, 0] }[action.direction] || [0, 1];
    const s = arrow(g, x, y, x + dx * len, y + dy * len, "player-scroll player-mark-scroll");
    el("circle", { cx: x, cy: y, r: f.unit * 0.8 }, s);
    label(s, x + f.unit * 1.2, y - f.unit * 1.2, `scroll ${action.direction}`, f);
  } else if (type === "type") {
    const text = String(action.content || "").replace(/\n$/, " ⏎");
    badge(g, f.w * 0.04, f.h * 0.82 - n * f.unit * 3.4, `⌨ “${text.slice(0, 80)}”`, f, "player-callout player-mark-type");
  } else if (type === "hotkey" || type === "press" || type === "release") {
    const keys = action.keys ? action.keys.join(" + ") : action.key;
    badge(g, f.w * 0.04, f.h * 0.04 + n * f.unit * 3.4, `${type === "hotkey" ? "⌘" : type} ${keys}`, f, "player-badge player-mark-hotkey");
  } else {
    const detail = action.content || action.url || action.app_name || "";
    badge(g, f.w * 0.04, f.h * 0.04 + n * f.unit * 3.4, detail ? `${type}: ${detail}` : type, f, `player-badge player-mark-${type}`);
  }
}

function draw() {
  const step = steps[at];
  const f = drawingFrame();
  overlay.setAttribute("viewBox", `0 0 ${f.w} ${f.h}`);
  frame.style.setProperty("--player-ratio", String(f.w / f.h));
  overlay.replaceChildren();
  const defs = el("defs", {}, overlay);
  const marker = el("marker", { id: "player-arrowhead", viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 5, markerHeight: 5, orient: "auto-start-reverse" }, defs);
  el("path", { d: "M 0 0 L 10 5 L 0 10 z" }, marker);
  for (const c of step.candidates) {
    if (c.chosen || !c.points) continue;
    for (const p of c.points) {
      const g = el("g", { class: "player-candidate-mark" }, overlay);
      el("circle", { cx: p[0] * f.sx, cy: p[1] * f.sy, r: f.unit * 0.7 }, g);
      label(g, p[0] * f.sx + f.unit, p[1] * f.sy + f.unit * 0.5, String(c.n + 1), f);
    }
  }
  const g = el("g", { class: preview ? "player-marks player-preview" : "player-marks" }, overlay);
  (preview || step.actions).forEach((a, n) => drawAction(g, a, f, n));
}

// --- the current step -------------------------------------------------------------------------------------------------

function text(id, value) {
  const node = $(id);
  if (node) node.textContent = value;
}

function render() {
  const step = steps[at];
  preview = null;
  text("player-position", `step ${at + 1} of ${steps.length}`);
  text("player-step-title", `Step ${step.index}`);
  const status = $("player-step-status");
  status.textContent = step.status;
  status.className = `pill ${step.status}`;
  text("player-step-source", step.source === "model" ? "model (accepted)" : "human");
  text("player-step-error", step.error || step.action_error);
  $("player-step-error").hidden = !(step.error || step.action_error);
  text("player-thought", step.thought || "(no thought)");
  text("player-reflection", step.reflection);
  $("player-reflection-box").hidden = !step.reflection;
  text("player-summary", step.action_summary);
  $("player-summary-box").hidden = !step.action_summary;
  text("player-action", step.action_text);
  renderCandidates(step);
  renderVerdicts(step);
  renderHistory(step);
  if (editable) {
    $("player-thought-edit").value = step.thought;
    $("player-action-edit").value = step.action_text;
    text("player-action-check", "");
    showError("");
    const cut = step.status === "cut";
    $("player-cut").hidden = cut;
    $("player-restore").hidden = !cut;
    for (const button of root.querySelectorAll(".player-verdict")) {
      const mine = step.verdicts.find((v) => v.reviewer_id === me);
      button.setAttribute("aria-pressed", String(Boolean(mine && mine.verdict === button.dataset.verdict)));
    }
  }
  frame.classList.toggle("player-cut", step.status === "cut");
  if (step.screenshot) {
    $("player-noshot").hidden = true;
    shot.hidden = false;
    if (shot.getAttribute("src") !== step.screenshot) shot.src = step.screenshot;
    if (shot.complete) draw();
  } else {
    shot.hidden = true;
    shot.removeAttribute("src");
    $("player-noshot").hidden = false;
    draw();
  }
  for (const thumb of root.querySelectorAll(".player-thumb")) {
    const current = Number(thumb.dataset.index) === at;
    thumb.toggleAttribute("aria-current", current);
    thumb.className = `player-thumb player-status-${steps[Number(thumb.dataset.index)].status}`;
    if (current) thumb.scrollIntoView({ block: "nearest", inline: "nearest" });
  }
  renderWords();
  for (const span of root.querySelectorAll(".player-span")) span.classList.toggle("now", Number(span.dataset.index) === at);
}
shot.addEventListener("load", draw);

function renderCandidates(step) {
  const box = $("player-candidates-box");
  box.hidden = step.candidates.length === 0;
  const verdict = step.overridden ? "overridden by the annotator" : step.chosen_candidate !== null ? `number ${step.chosen_candidate + 1} accepted` : "";
  text("player-latency", [verdict, step.latency_ms ? `model ${step.latency_ms} ms` : ""].filter(Boolean).join(" · "));
  const list = $("player-candidates");
  list.replaceChildren();
  for (const c of step.candidates) {
    const li = document.createElement("li");
    li.className = c.chosen ? "chosen" : c.error ? "invalid" : "";
    const head = document.createElement("div");
    head.textContent = c.chosen ? "✓ accepted" : c.error ? `invalid: ${c.error}` : "";
    const pre = document.createElement("pre");
    pre.textContent = c.error ? c.raw : `Thought: ${c.thought}\nAction: ${c.action_text}`;
    li.append(head, pre);
    list.append(li);
  }
}

function renderVerdicts(step) {
  const names = { ok: "OK", wrong_action: "wrong action", wrong_thought: "wrong thought", bad_screenshot: "bad screenshot" };
  text("player-verdicts", step.verdicts.length ? "Verdicts: " + step.verdicts.map((v) => `${names[v.verdict] || v.verdict} (${v.reviewer})`).join(", ") : "No step verdict yet.");
}

function renderHistory(step) {
  text("player-history-count", String(step.history.length));
  const list = $("player-history");
  list.replaceChildren();
  for (const e of step.history) {
    const li = document.createElement("li");
    const head = document.createElement("div");
    head.textContent = `${e.field} by ${e.editor}, ${new Date(e.at).toLocaleString()}`;
    const before = document.createElement("del");
    before.textContent = e.before || "(empty)";
    const after = document.createElement("ins");
    after.textContent = e.after || "(empty)";
    li.append(head, before, document.createTextNode(" → "), after);
    list.append(li);
  }
}

function go(index) {
  at = Math.max(0, Math.min(steps.length - 1, index));
  render();
}

// --- keyboard and playing ---------------------------------------------------------------------------------------------

let timer = null;
function play(on) {
  clearInterval(timer);
  timer = null;
  if (on) {
    if (at === steps.length - 1) go(0);
    timer = setInterval(() => (at < steps.length - 1 ? go(at + 1) : play(false)), Number($("player-speed").value));
  }
  $("player-play").textContent = timer ? "Pause" : "Play";
  root.classList.toggle("player-playing", Boolean(timer));
}
$("player-play").addEventListener("click", () => play(!timer));
$("player-speed").addEventListener("change", () => timer && play(true));
$("player-prev").addEventListener("click", () => go(at - 1));
$("player-next").addEventListener("click", () => go(at + 1));
for (const thumb of root.querySelectorAll(".player-thumb")) thumb.addEventListener("click", () => go(Number(thumb.dataset.index)));
// Curation's divergent steps (templates/curation/_trajectory_flags.html) name steps by their index: show that step.
for (const link of document.querySelectorAll(".divergent-step")) {
  link.addEventListener("click", (event) => {
    const position = steps.findIndex((step) => step.index === Number(link.dataset.step));
    if (position < 0) return;
    event.preventDefault();
    go(position);
    root.scrollIntoView({ behavior: "smooth", block: "start" });
  });
}

document.addEventListener("keydown", (event) => {
  const target = event.target;
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  if (target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
  if (event.key === "ArrowRight" || event.key === "j") go(at + 1);
  else if (event.key === "ArrowLeft" || event.key === "k") go(at - 1);
  else if (event.key === " " && !(target.closest && target.closest("button"))) play(!timer);
  else return;
  event.preventDefault();
});

// --- audio: each step's span, the words as they are said --------------------------------------------------------------

const audio = $("player-audio");
// Seek the audio, also before its metadata has loaded (a time set then would be lost).
function seek(t) {
  if (audio.readyState >= 1) audio.currentTime = t;
  else audio.addEventListener("loadedmetadata", () => { audio.currentTime = t; }, { once: true });
}
function renderWords() {
  const box = $("player-words");
  if (!box) return;
  box.replaceChildren();
  for (const w of steps[at].words) {
    const span = document.createElement("span");
    span.className = "player-word";
    span.textContent = w.text.trim() + " ";
    span.dataset.start = w.start;
    span.dataset.end = w.end;
    span.addEventListener("click", () => { seek(w.start); audio.play(); });
    box.append(span);
  }
}
if (audio) {
  const bar = $("player-timeline");
  const layout = () => {
    const total = (Number.isFinite(audio.duration) && audio.duration) || Math.max(1, ...steps.map((s) => (s.span ? s.span.end : 0)));
    bar.replaceChildren();
    steps.forEach((s, i) => {
      if (!s.span) return;
      const seg = document.createElement("button");
      seg.type = "button";
      seg.className = "player-span";
      seg.dataset.index = i;
      seg.title = `step ${s.index}: ${s.span.start.toFixed(1)}–${s.span.end.toFixed(1)} s`;
      seg.style.left = `${(100 * s.span.start) / total}%`;
      seg.style.width = `${Math.max(0.5, (100 * (s.span.end - s.span.start)) / total)}%`;
      seg.textContent = s.index;
      seg.addEventListener("click", () => { seek(s.span.start); go(i); });
      bar.append(seg);
    });
    const head = document.createElement("div");
    head.className = "player-playhead";
    head.id = "player-playhead";
    bar.append(head);
    follow();
  };
  const follow = () => {
    const t = audio.currentTime;
    const total = (Number.isFinite(audio.duration) && audio.duration) || 1;
    const head = $("player-playhead");
    if (head) head.style.left = `${Math.min(100, (100 * t) / total)}%`;
    if (!audio.paused) {
      const i = steps.findIndex((s) => s.span && s.span.start <= t && t < s.span.end);
      if (i >= 0 && i !== at) go(i);
    }
    for (const w of document.querySelectorAll(".player-word")) {
      w.classList.toggle("now", Number(w.dataset.start) <= t && t < Number(w.dataset.end) + 0.05);
    }
  };
  audio.addEventListener("loadedmetadata", layout);
  audio.addEventListener("timeupdate", follow);
  audio.addEventListener("seeked", follow);
  let frameRequest = null;
  const tick = () => { follow(); frameRequest = audio.paused ? null : requestAnimationFrame(tick); };
  audio.addEventListener("play", () => { if (frameRequest === null) frameRequest = requestAnimationFrame(tick); });
  layout();
}

// --- verdicts, edits, cuts ---------------------------------------------------------------------------------------------

function merge(reply) {
  for (const fresh of reply.steps) {
    const i = steps.findIndex((s) => s.index === fresh.index);
    if (i >= 0) steps[i] = { ...steps[i], ...fresh, span: steps[i].span, words: steps[i].words };
  }
  render();
}

async function change(path, fields, busy) {
  busy.disabled = true;
  try {
    merge(await post(path, fields));
    showError("");
  } catch (error) {
    showError(error.message);
  } finally {
    busy.disabled = false;
  }
}

if (editable) {
  const path = (what) => `steps/${steps[at].index}/${what}/`;
  for (const button of root.querySelectorAll(".player-verdict")) {
    button.addEventListener("click", () => change(path("verdict"), { verdict: button.dataset.verdict }, button));
  }
  $("player-save-thought").addEventListener("click", (e) => change(path("edit"), { field: "thought", value: $("player-thought-edit").value }, e.currentTarget));
  $("player-save-action").addEventListener("click", (e) => change(path("edit"), { field: "action", value: $("player-action-edit").value }, e.currentTarget));
  $("player-cut").addEventListener("click", (e) => change(path("cut"), {}, e.currentTarget));
  $("player-restore").addEventListener("click", (e) => change(path("restore"), {}, e.currentTarget));

  // The action being edited is checked by the grammar on the server and drawn as a preview before it is saved.
  let pending = null;
  let asked = 0;
  $("player-action-edit").addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(async () => {
      const mine = ++asked;
      const value = $("player-action-edit").value;
      const check = $("player-action-check");
      try {
        const reply = await post(path("check"), { action: value });
        if (mine !== asked) return;
        preview = reply.actions;
        check.textContent = "✓ valid: the preview on the screenshot shows it; save to keep it.";
        check.className = "ok-text";
      } catch (error) {
        if (mine !== asked) return;
        preview = null;
        check.textContent = error.message;
        check.className = "error-text";
      }
      draw();
    }, 250);
  });
}

render();
