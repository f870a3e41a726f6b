"""Think-aloud refinement through the real embedded policy server: each spoken step's thought is the model's rewrite,
the raw transcript stays beside it, and a server that fails leaves the raw thoughts with a warning."""

from __future__ import annotations

import pytest

from annotation_app.insitu import pipeline
from annotation_app.insitu.refine import refine_request, refine_thought
from annotation_app.live import policy_for
from flywheel.models import ModelVersion

from ..insitu.captures import scripted, upload
from ..servers import free_port

pytestmark = pytest.mark.slow


def _model(url: str) -> ModelVersion:
    model = ModelVersion.objects.create(name="tiny-refiner", checkpoint_uri="tiny", endpoint_url=url,
                                        served_name="tiny-uitars")  # fmt: skip
    model.promote()
    return model


@pytest.mark.django_db(transaction=True)
def test_refined_thoughts_come_from_the_policy_server_and_the_raw_transcript_is_kept(
    api, media, tmp_path, settings, policy_url
):
    settings.INSITU_REFINE = True
    model = _model(policy_url)
    builder = scripted(tmp_path)
    state = upload(api, builder.archive(), builder.session_id, instruction=builder.instruction)
    capture = pipeline.process(state["id"])
    assert capture.status == "ready", capture.error
    assert not [w for w in capture.warnings if "refinement" in w], capture.warnings
    steps = list(capture.trajectory.steps.order_by("index"))
    client = policy_for(model)
    for step, aligned in zip(steps, capture.alignment, strict=True):
        assert aligned["raw"], "every step of the scripted session was spoken"
        # temperature 0: asking the server again for this step gives the stored refinement
        again = refine_thought(client, builder.instruction, aligned["raw"], step.action_text)
        assert aligned["refined"] == again is not None and step.thought == (again or aligned["raw"])
    # (the random tiny model's greedy answers decode to nothing; an empty refinement keeps the raw thought)
    assert "file menu" in capture.alignment[0]["raw"].lower()  # the transcript itself is untouched
    body = refine_request("m", builder.instruction, capture.alignment[0]["raw"], steps[0].action_text)
    assert capture.alignment[0]["raw"] in body["messages"][1]["content"] and body["temperature"] == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_failing_policy_server_leaves_the_raw_thoughts_and_says_so(api, media, tmp_path, settings):
    settings.INSITU_REFINE, settings.POLICY_TIMEOUT_S = True, 2
    _model(f"http://127.0.0.1:{free_port()}/v1")  # nobody listens there
    builder = scripted(tmp_path)
    state = upload(api, builder.archive(), builder.session_id, instruction=builder.instruction)
    capture = pipeline.process(state["id"])
    assert capture.status == "ready", capture.error
    assert any("refinement stopped at step 0" in w for w in capture.warnings), capture.warnings
    steps = list(capture.trajectory.steps.order_by("index"))
    assert [s.thought for s in steps] == [a["raw"] for a in capture.alignment]
    assert all(a["refined"] is None for a in capture.alignment)
