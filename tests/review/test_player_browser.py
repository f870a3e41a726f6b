"""The trajectory player in real Chromium: a data lead replays with the keyboard and the filmstrip, plays the steps,
edits an action (the overlay moves with the preview before saving; a bad action is refused with the grammar's
message on the page), judges a step and cuts the trajectory; an in-situ capture's steps are spans on its audio."""

from __future__ import annotations

import io
import math
import uuid
import wave

import pytest
from django.core.files.base import ContentFile
from django.utils import timezone
from PIL import Image
from playwright.sync_api import Page, expect

from annotation_app.models import Capture, Recording, Role, Step, StepEdit, StepVerdict, Trajectory

from ..browsers import chromium_pages, log_in
from ..factories import TaskFactory, UserFactory
from ..servers import web_stack

pytestmark = pytest.mark.slow

SCREEN = (1280, 800)
ACTIONS = [
    "click(start_box='(320,200)')",
    "drag(start_box='(100,100)', end_box='(600,500)')",
    "type(content='hello world\\n')",
    "hotkey(key='ctrl s')",
]


def _png(colour: tuple[int, int, int]) -> ContentFile:
    out = io.BytesIO()
    Image.new("RGB", (SCREEN[0] // 2, SCREEN[1] // 2), colour).save(out, format="PNG")  # half the screen's size
    return ContentFile(out.getvalue())


def _trajectory(mode: str = Trajectory.Mode.INTERACTIVE) -> Trajectory:
    annotator = UserFactory(username=f"ann-{uuid.uuid4().hex[:6]}", role=Role.ANNOTATOR)
    trajectory = Trajectory.objects.create(
        task=TaskFactory(instruction="Save the greeting."), annotator=annotator, mode=mode,
        status=Trajectory.Status.SUBMITTED, submitted_at=timezone.now(), screen_width=SCREEN[0],
        screen_height=SCREEN[1],
    )  # fmt: skip
    for i, action in enumerate(ACTIONS):
        step = Step(trajectory=trajectory, index=i, thought=f"Thought {i}.", action_text=action)
        if i == 0 and mode == Trajectory.Mode.INTERACTIVE:
            step.candidates = [
                {"thought": "Click there.", "action_text": "click(start_box='(320,200)')", "actions": [],
                 "points": [[320, 200]], "raw": "", "error": "", "model": "tiny"},
                {"thought": "Or here.", "action_text": "click(start_box='(900,700)')", "actions": [],
                 "points": [[900, 700]], "raw": "", "error": "", "model": "tiny"},
            ]  # fmt: skip
            step.chosen_candidate, step.model_latency_ms = 0, 812
        if mode == Trajectory.Mode.IN_SITU:
            step.action = {"actions": [], "t": [1.0 + i, 1.2 + i]}
        step.screenshot.save(f"{i}.png", _png((40 * i, 120, 200)), save=False)
        step.save()
    return trajectory


def _relative(page: Page, selector: str) -> tuple[float, float]:
    """Where the element's centre is on the screenshot, as a share of its width and height (both boxes read in one
    call, so a scroll between them cannot skew it)."""
    box, shot = page.evaluate(
        """(selector) => [document.querySelector(selector), document.getElementById('player-shot')]
             .map((e) => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })""",
        selector,
    )
    x, y = box[0] + box[2] / 2, box[1] + box[3] / 2
    return (x - shot[0]) / shot[2], (y - shot[1]) / shot[3]


def test_a_lead_replays_edits_previews_judges_and_cuts(transactional_db, media, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    trajectory = _trajectory()

    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        page = new_page()
        page.set_viewport_size({"width": 1400, "height": 1000})
        log_in(page, "lead1")
        page.goto("/lead/trajectories/")
        page.click(f"a[href='/lead/trajectories/{trajectory.pk}/']")
        position = page.locator("#player-position")
        expect(position).to_have_text("step 1 of 4")
        expect(page.locator("#player-overlay .player-mark-click")).to_have_count(1)
        # the click is drawn where it happened: (320,200) of 1280x800 on a half-size screenshot
        x, y = _relative(page, "#player-overlay .player-mark-click circle")
        assert abs(x - 0.25) < 0.02 and abs(y - 0.25) < 0.02, (x, y)
        expect(page.locator("#player-candidates li")).to_have_count(2)
        expect(page.locator("#player-latency")).to_contain_text("number 1 accepted · model 812 ms")
        page.screenshot(path=tmp_path / "player-step0.png")

        # the keyboard: → j k ←, and each step's own drawing
        page.keyboard.press("ArrowRight")
        expect(position).to_have_text("step 2 of 4")
        expect(page.locator("#player-overlay .player-mark-drag")).to_have_count(1)
        page.keyboard.press("j")
        expect(position).to_have_text("step 3 of 4")
        expect(page.locator("#player-overlay .player-mark-type")).to_contain_text("hello world")
        page.keyboard.press("j")
        expect(page.locator("#player-overlay .player-mark-hotkey")).to_contain_text("ctrl + s")
        page.keyboard.press("k")
        expect(position).to_have_text("step 3 of 4")
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("ArrowLeft")
        expect(position).to_have_text("step 1 of 4")
        # space plays to the end at the chosen speed, then stops
        page.select_option("#player-speed", "250")
        page.locator("#player-shot").click()
        page.keyboard.press(" ")
        expect(position).to_have_text("step 4 of 4")
        expect(page.locator("#player-play")).to_have_text("Play")
        page.click(".player-thumb[data-index='0']")
        expect(position).to_have_text("step 1 of 4")

        # editing the action: the overlay moves with the preview, before anything is saved
        # (positions on the screenshot: typing in the side panel may scroll the page)
        before = _relative(page, "#player-overlay .player-mark-click circle")
        page.fill("#player-action-edit", "click(start_box='(960,600)')")
        expect(page.locator("#player-action-check")).to_contain_text("valid")
        expect(page.locator("#player-overlay .player-preview .player-mark-click")).to_have_count(1)
        after = _relative(page, "#player-overlay .player-mark-click circle")
        assert abs(before[0] - 0.25) < 0.02 and abs(before[1] - 0.25) < 0.02, before
        assert abs(after[0] - 0.75) < 0.02 and abs(after[1] - 0.75) < 0.02, after
        assert Step.objects.get(trajectory=trajectory, index=0).action_text == ACTIONS[0]  # nothing saved yet
        # a bad action: the grammar's message, and the refusal (400) on the page when saving anyway
        page.fill("#player-action-edit", "click(start_box='(960,")
        expect(page.locator("#player-action-check")).to_contain_text("does not parse")
        page.click("#player-save-action")
        expect(page.locator("#player-error")).to_contain_text("The action does not parse: line 1")
        page.fill("#player-action-edit", "click(start_box='(960,600)')")
        page.click("#player-save-action")
        expect(page.locator("#player-action")).to_have_text("click(start_box='<|box_start|>(960,600)<|box_end|>')")
        expect(page.locator("#player-error")).to_be_hidden()
        expect(page.locator("#player-history-count")).to_have_text("1")
        page.click("#player-history-box summary")
        expect(page.locator("#player-history")).to_contain_text("click(start_box='(320,200)')")
        page.fill("#player-thought-edit", "The save button is bottom right.")
        page.click("#player-save-thought")
        expect(page.locator("#player-thought")).to_have_text("The save button is bottom right.")
        page.click(".player-verdict[data-verdict='wrong_thought']")
        expect(page.locator(".player-verdict[data-verdict='wrong_thought']")).to_have_attribute("aria-pressed", "true")
        expect(page.locator("#player-verdicts")).to_contain_text("wrong thought (lead1)")
        page.screenshot(path=tmp_path / "player-edited.png")

        # cut at step 2 (index 2): it and the later step are cut, restorable
        page.keyboard.press("j")
        page.keyboard.press("j")
        page.click("#player-cut")
        expect(page.locator("#player-step-status")).to_have_text("cut")
        expect(page.locator("#player-restore")).to_be_visible()
        expect(page.locator(".player-thumb.player-status-cut")).to_have_count(2)
        page.screenshot(path=tmp_path / "player-cut.png")

    statuses = dict(trajectory.steps.values_list("index", "status"))
    assert statuses == {0: "done", 1: "done", 2: "cut", 3: "cut"}
    first = trajectory.steps.get(index=0)
    assert first.action_text == "click(start_box='<|box_start|>(960,600)<|box_end|>')"
    assert list(first.edits.values_list("field", flat=True)) == ["action", "thought"]
    assert StepVerdict.objects.get(step=first).verdict == "wrong_thought"
    assert StepEdit.objects.filter(field="status").count() == 2


def _silent_wav(seconds: float) -> ContentFile:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * math.ceil(8000 * seconds))
    return ContentFile(out.getvalue())


def test_an_in_situ_capture_plays_with_each_steps_span_on_the_audio(transactional_db, media, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    UserFactory(username="lead2", role=Role.DATA_LEAD)
    trajectory = _trajectory(Trajectory.Mode.IN_SITU)
    recording = Recording(trajectory=trajectory, audio_content_type="audio/wav", duration_s=6.0)
    recording.audio.save("audio.wav", _silent_wav(6.0), save=True)
    Capture.objects.create(
        annotator=trajectory.annotator, session_id=uuid.uuid4(), size=1, sha256="0" * 64, trajectory=trajectory,
        status=Capture.Status.SUBMITTED, meta={"audio": {"offset": 0.5}},
        alignment=[{"words": [{"text": f"word{i}", "start": 0.6 + i, "end": 0.9 + i}], "raw": f"word{i}"}
                   for i in range(4)],
    )  # fmt: skip

    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        page = new_page()
        log_in(page, "lead2")
        page.goto(f"/lead/trajectories/{trajectory.pk}/")
        spans = page.locator("#player-timeline .player-span")
        expect(spans).to_have_count(4)
        expect(page.locator("#player-words")).to_have_text("word0")
        page.click("#player-timeline .player-span[data-index='2']")
        expect(page.locator("#player-position")).to_have_text("step 3 of 4")
        expect(page.locator("#player-words")).to_have_text("word2")
        # the audio jumped to the step's span: words said before the action, on the audio's clock (offset 0.5 s)
        page.wait_for_function("Math.abs(document.getElementById('player-audio').currentTime - 1.7) < 0.05")
        expect(page.locator("#player-timeline .player-span.now")).to_have_attribute("data-index", "2")
