// The think-aloud timeline: the words light up as the audio plays (and clicking a word seeks to it), the action of
// each step is drawn on its screenshot, thoughts save as you type, and the capture is submitted from here.
import { problem } from "./api_problem.js";
const root = document.getElementById("timeline");
const data = JSON.parse(document.getElementById("timeline-data").textContent);
const audio = document.getElementById("capture-audio");
const offset = data.audio_offset || 0; // capture time of audio time 0
const words = [...root.querySelectorAll(".word")].map((el) => ({
  el,
  start: parseFloat(el.dataset.start),
  end: parseFloat(el.dataset.end),
  step: el.closest(".step"),
}));

async function send(url, method, body) {
  const response = await fetch(url, {
    method,
    headers: { "Content-Type": "application/json", "X-CSRFToken": root.dataset.csrf },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const reply = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(problem(reply, response.status));
  return reply;
}

// --- words follow the audio -----------------------------------------------------------------------------------------
let current = null;
function highlight() {
  const t = audio.currentTime + offset;
  const word = words.find((w) => w.start <= t && t < w.end + 0.05) || null;
  if (word === current) return;
  if (current) { current.el.classList.remove("now"); current.step.classList.remove("now"); }
  current = word;
  if (word) {
    word.el.classList.add("now");
    word.step.classList.add("now");
    if (!audio.paused) word.step.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }
}
if (audio) {
  audio.addEventListener("timeupdate", highlight);
  audio.addEventListener("seeked", highlight);
  let frame = null; // timeupdate fires ~4 times a second: follow each frame while playing for a smooth highlight
  const follow = () => { highlight(); frame = audio.paused ? null : requestAnimationFrame(follow); };
  audio.addEventListener("play", () => { if (frame === null) frame = requestAnimationFrame(follow); });
  for (const w of words) {
    w.el.addEventListener("click", () => { audio.currentTime = Math.max(0, w.start - offset); audio.play(); });
  }
}

// --- actions drawn on their screenshots ---------------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";
function mark(svg, x, y, label) {
  const g = document.createElementNS(SVG, "g");
  g.setAttribute("class", "mark");
  const r = Math.max(data.screen.width, data.screen.height) / 80;
  const c = document.createElementNS(SVG, "circle");
  c.setAttribute("cx", x); c.setAttribute("cy", y); c.setAttribute("r", r);
  const text = document.createElementNS(SVG, "text");
  text.setAttribute("x", x + r * 1.2); text.setAttribute("y", y - r * 1.2);
  text.setAttribute("font-size", r * 1.6);
  text.textContent = label;
  g.append(c, text);
  svg.append(g);
}
for (const shot of root.querySelectorAll(".shot")) {
  const step = data.steps.find((s) => s.index === Number(shot.dataset.step));
  const svg = shot.querySelector("svg");
  for (const action of (step.action && step.action.actions) || []) {
    if (action.point) mark(svg, action.point[0], action.point[1], action.type);
    if (action.start) mark(svg, action.start[0], action.start[1], "drag");
    if (action.end) mark(svg, action.end[0], action.end[1], "drop");
  }
}

// --- thoughts save as you type ---------------------------------------------------------------------------------------
if (root.dataset.editable) {
  for (const area of root.querySelectorAll("textarea.thought")) {
    const state = area.closest(".step").querySelector(".save-state");
    let timer = null;
    const save = async () => {
      timer = null;
      state.textContent = "saving…";
      try {
        await send(area.dataset.url, "PUT", { thought: area.value });
        state.textContent = "saved";
      } catch (err) {
        state.textContent = `not saved: ${err.message}`;
      }
    };
    area.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(save, 400); });
    area.addEventListener("blur", () => { if (timer) { clearTimeout(timer); save(); } });
    // A module runs after the page shows: what was typed before this ran had no listener, so it is saved now.
    if (area.value !== area.defaultValue) save();
  }
}

// --- submitting: a warning to confirm (not a block) when thoughts are empty or no speech was heard -----------------
const submit = document.getElementById("submit-capture");
const warning = document.getElementById("submit-warning");

function submitWarnings() {
  const empty = [...root.querySelectorAll("textarea.thought")].filter((area) => !area.value.trim()).length;
  const reasons = [];
  if ((data.flags || []).includes("no_speech")) {
    reasons.push("No speech was heard in the recording: the thoughts are what you typed, if anything.");
  }
  if (empty === 1) reasons.push(`1 of ${data.steps.length} steps has an empty thought: nothing says why its action was done.`);
  if (empty > 1) reasons.push(`${empty} of ${data.steps.length} steps have an empty thought: nothing says why their actions were done.`);
  return reasons;
}

async function sendSubmit() {
  submit.disabled = true;
  document.getElementById("submit-error").hidden = true;
  try {
    await send(submit.dataset.url, "POST");
    window.location.reload();
  } catch (err) {
    submit.disabled = false;
    const line = document.getElementById("submit-error");
    line.textContent = `Not submitted: ${err.message}`;
    line.hidden = false;
  }
}

if (submit) {
  submit.addEventListener("click", () => {
    const reasons = submitWarnings();
    if (!reasons.length) return sendSubmit();
    const list = document.getElementById("submit-warning-list");
    list.replaceChildren(...reasons.map((text) => Object.assign(document.createElement("li"), { textContent: text })));
    warning.hidden = false;
    warning.scrollIntoView({ block: "nearest" });
  });
  document.getElementById("submit-anyway").addEventListener("click", () => { warning.hidden = true; sendSubmit(); });
  document.getElementById("keep-editing").addEventListener("click", () => {
    warning.hidden = true;
    const area = [...root.querySelectorAll("textarea.thought")].find((a) => !a.value.trim());
    if (area) area.focus();
  });
}
