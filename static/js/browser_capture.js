// Think-aloud in the browser: drive the sandbox desktop over noVNC (interactive) while MediaRecorder records the
// microphone. The desktop's input events are captured by the sandbox; on stop the audio goes to the server with the
// offset between the two clocks, and the capture is processed like an upload from the recorder.
// The desktop is leased and set up by a Celery task: until it is ready (data-ready) the page shows "starting the
// desktop…", Record stays disabled and noVNC does not connect; the capture's status poll (htmx) reloads the page
// when it is ready, or shows why it failed.
// While recording the page shows a timer and the microphone's level (a Web Audio AnalyserNode). Pause mutes the
// microphone track instead of pausing MediaRecorder: a muted track records silence, so the audio keeps the capture
// clock's length and every word after a pause stays aligned with the desktop's events (MediaRecorder.pause() would
// drop the paused span from the file and shift every later word by its length). The desktop is view-only while
// paused, so no action is taken without the annotator's voice; the desktop recorder's pause works the same way.
import RFB from "../vendor/novnc/core/rfb.js";

const root = document.getElementById("browser-capture");
const api = root.dataset.api; // /api/insitu/captures/<id>/
const $ = (id) => document.getElementById(id);
let recorder = null;
let chunks = [];
let recorderStarted = 0; // performance.now() when the microphone's first sample was taken
let offset = 0; // capture-clock time of the audio's first sample
let rfb = null;
let meter = null; // {context, analyser, samples, timer}
let paused = null; // performance.now() when the current pause began
let pausedTotal = 0; // milliseconds paused so far
window.thinkAloud = { state: "idle", level: 0, peak: 0, pauses: [] }; // read by the browser test

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

function clock(ms) {
  const s = Math.floor(ms / 1000);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

// The timer (recorded time, pauses included as the audio includes them, and the time paused) and the level meter.
function showMeter(stream) {
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const tick = () => {
    analyser.getFloatTimeDomainData(samples);
    let peak = 0;
    for (const v of samples) peak = Math.max(peak, Math.abs(v));
    const level = Math.min(1, peak);
    window.thinkAloud.level = level;
    window.thinkAloud.peak = Math.max(window.thinkAloud.peak, level);
    $("mic-level").value = level;
    const now = performance.now();
    const pausedNow = pausedTotal + (paused === null ? 0 : now - paused);
    $("rec-timer").textContent = clock(now - recorderStarted) + (pausedNow >= 1000 ? ` (${clock(pausedNow)} paused)` : "");
  };
  meter = { context, analyser, timer: setInterval(tick, 100) }; // not requestAnimationFrame: it stops in a hidden tab
  $("recording-meters").hidden = false;
}

function hideMeter() {
  if (!meter) return;
  clearInterval(meter.timer);
  meter.context.close();
  meter = null;
}

function captureTime() {
  return offset + (performance.now() - recorderStarted) / 1000;
}
window.thinkAloud.captureTime = captureTime;

function togglePause() {
  const track = recorder.stream.getAudioTracks()[0];
  if (paused === null) {
    paused = performance.now();
    track.enabled = false; // silence from here: the audio keeps its length
    if (rfb) rfb.viewOnly = true;
    window.thinkAloud.pauses.push({ start: captureTime(), end: null });
    window.thinkAloud.state = "paused";
    $("pause").textContent = "Resume";
    $("vnc").classList.add("paused");
    say("paused: nothing you say is used, and the desktop is frozen until you resume");
  } else {
    pausedTotal += performance.now() - paused;
    paused = null;
    track.enabled = true;
    if (rfb) { rfb.viewOnly = false; rfb.focus({ preventScroll: true }); }
    window.thinkAloud.pauses.at(-1).end = captureTime();
    window.thinkAloud.state = "recording";
    $("pause").textContent = "Pause";
    $("vnc").classList.remove("paused");
    say("recording: say what you think as you work");
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
    showMeter(stream);
    $("stop").disabled = false;
    $("pause").disabled = false;
    // Controls at the top of the window, the desktop below them (it is sized to fit: .vnc.fit-screen), so Stop stays
    // in sight; then the keyboard goes back to the desktop (the Record button had the focus, and a canvas click
    // only takes it) without scrolling the page again.
    $("capture-controls").scrollIntoView({ block: "start" });
    if (rfb) rfb.focus({ preventScroll: true });
  } catch (error) {
    if (recorder && recorder.state !== "inactive") recorder.stop();
    if (recorder) recorder.stream.getTracks().forEach((track) => track.stop());
    hideMeter();
    say("could not start: " + error.message);
    $("record").disabled = false;
  }
}

async function stop() {
  $("stop").disabled = true;
  $("pause").disabled = true;
  if (paused !== null) togglePause(); // the pause ends with the recording
  hideMeter();
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
$("pause").addEventListener("click", togglePause);
if (root.dataset.ready === "1") {
  connectVnc();
} else {
  window.thinkAloud.state = "starting";
}
