"""Live proposals on a browser task carry the page's outline, in the model's frame, as the trainer's SandboxEnv gives
it (sandbox/outline.py): a model trained with it is prompted the same way in live annotation."""

from __future__ import annotations

import re

import pytest

from annotation_app.live import sessions as live
from annotation_app.models import LiveSession, Role, Task
from annotation_app.task_queue import next_task
from sandbox.outline import parse, render
from sandbox.suite import make_task

from ..waiting import wait_for
from .conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow]


def test_a_browser_session_gives_the_model_the_page_outline(live_worker, embedded_model, make_user, settings):
    suite = make_task("click-button", 1, "train", 1)
    task = Task.objects.create(
        instruction=suite["instruction"], platform="browser", setup_config=suite["config"],
        evaluator=suite["evaluator"], metadata=suite["metadata"],
    )  # fmt: skip
    annotator = make_user(Role.ANNOTATOR)
    next_task(annotator)
    session = live.open_live(annotator, task)
    try:
        assert wait_for(lambda: LiveSession.objects.get(pk=session.pk).status == "active", timeout=120), (
            live_worker.read_text()[-3000:]
        )
        session.refresh_from_db()
        text, elements = live.page_outline(session)
        assert text.startswith("Interactive elements (role, label, state, centre):"), text
        centres = [tuple(map(int, m)) for m in re.findall(r"\((\d+),\s*(\d+)\)", text)]
        assert len(centres) >= 3, text  # level 1 has three buttons
        # In the model's frame: every centre lies inside the model-sized screenshot, not the screen.
        assert all(0 <= x <= session.model_width and 0 <= y <= session.model_height for x, y in centres), text
        assert [e["role"] for e in elements].count("button") >= 3, elements

        # The step taken on this observation keeps the outline the proposals were asked with (screen pixels), so the
        # exported episode shows the model the same text (flywheel/export.py).
        assert wait_for(lambda: LiveSession.objects.get(pk=session.pk).observation_outline is not None, timeout=120)
        session.refresh_from_db()
        button = next(e for e in session.observation_outline if e["role"] == "button")
        x, y = round(button["x"] + button["w"] / 2), round(button["y"] + button["h"] / 2)
        mx, my = live.frame_of(session).to_model(x, y)
        step = live.take_step(session, expected_index=0, thought="Click it.", action_text=f"click(point='({mx},{my})')")
        step.refresh_from_db()
        assert step.outline == session.observation_outline
        assert button["text"] in render(parse({"elements": step.outline}), live.frame_of(session).scale)
        session.refresh_from_db()
        assert session.next_index == 1

        settings.LIVE_OUTLINE = False
        assert live.page_outline(session) == (None, None)
    finally:
        live.end_live(session, "abandoned")
