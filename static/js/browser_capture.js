// Think-aloud in the browser: drive the sandbox desktop over noVNC (interactive) while MediaRecorder records the
// microphone. The desktop's input events are captured by the sandbox; on stop the audio goes to the server with the
// offset between the two clocks, and the capture is processed like an upload from the recorder.
// The desktop is leased and set up by a Celery task: until it is ready (data-ready) the page shows "starting the
// desktop…", Record stays disabled and noVNC does not connect; the capture's status poll (htmx) reloads the page
// when it is ready, or shows why it failed.
import RFB from "../vendor/novnc/core/rfb.js";

const root = document.getElementById("browser-capture");
const api = root.dataset.api; // /api/insitu/captures/<id>/
const $ = (id) => document.getElementById(id);
let recorder = null;
let chunks = [];
let recorderStarted = 0; // performance.now() when the microphone's first sample was taken
let offset = 0; // capture-clock time of the audio's first sample
let rfb = null;
window.thinkAloud = { state: "idle" }; // read by the browser test

async function call(path, body, form) {
  const response = await fetch(api + path, {
    method: "POST",
    headers: form ? { "X-CSRFToken": root.dataset.csrf } : { "Content-Type": "application/json", "X-CSRFToken": root.dataset.csrf },
    body: form || JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(data.detail || `HTTP ${response.status}`);
  return data;
}

function say(text) { $("capture-state").textContent = text; }

async function connectVnc() {
  try {
    const { token, port } = await call("vnc-token/");
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    rfb = new RFB($("vnc"), `${scheme}://${location.hostname}:${port}/?token=${encodeURIComponent(token)}`);
    rfb.viewOnly = false; // the annotator works on the desktop directly: every input is captured there
    rfb.scaleViewport = true;
    rfb.addEventListener("connect", () => { root.dataset.vnc = "connected"; });
    rfb.addEventListener("disconnect", () => { root.dataset.vnc = "disconnected"; });
  } catch (error) {
    say("desktop unavailable: " + error.message);
  }
}

async function start() {
  $("record").disabled = true;
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const type = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm"].find((t) => MediaRecorder.isTypeSupported(t));
    recorder = new MediaRecorder(stream, type ? { mimeType: type } : {});
    chunks = [];
    recorder.ondataavailable = (e) => { if (e.data.size) chunks.push(e.data); };
    await new Promise((resolve) => { recorder.onstart = resolve; recorder.start(1000); });
    recorderStarted = performance.now();
    const { t } = await call("record/");
    // the server answered with its clock: the audio started (now − recorderStarted) seconds before that
    offset = t - (performance.now() - recorderStarted) / 1000;
    window.thinkAloud.state = "recording";
    say("recording: say what you think as you work");
    $("stop").disabled = false;
    // Controls at the top of the window, the desktop below them (it is sized to fit: .vnc.fit-screen), so Stop stays
    // in sight; then the keyboard goes back to the desktop (the Record button had the focus, and a canvas click
    // only takes it) without scrolling the page again.
    $("capture-controls").scrollIntoView({ block: "start" });
    if (rfb) rfb.focus({ preventScroll: true });
  } catch (error) {
    say("could not start: " + error.message);
    $("record").disabled = false;
  }
}

async function stop() {
  $("stop").disabled = true;
  say("uploading…");
  const stopped = new Promise((resolve) => { recorder.onstop = resolve; });
  recorder.stop();
  recorder.stream.getTracks().forEach((track) => track.stop());
  await stopped;
  const blob = new Blob(chunks, { type: recorder.mimeType || "audio/webm" });
  const form = new FormData();
  form.append("audio", blob, blob.type.includes("ogg") ? "audio.ogg" : "audio.webm");
  form.append("audio_offset", String(offset));
  try {
    await call("finish/", null, form);
    window.thinkAloud.state = "finished";
    window.location.reload();
  } catch (error) {
    say("not saved: " + error.message);
    $("stop").disabled = false;
  }
}

$("record").addEventListener("click", start);
$("stop").addEventListener("click", stop);
if (root.dataset.ready === "1") {
  connectVnc();
} else {
  window.thinkAloud.state = "starting";
}
