"""Seeded live sessions: a session opened with a seed gets the same sampled proposals for the same step every time
(a simulated run can be repeated); the API checks the seed."""

from __future__ import annotations

import io

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse
from PIL import Image

from annotation_app.live import sessions as live
from annotation_app.models import LiveSession, Role, Trajectory
from annotation_app.simulated import session_seed, simulated_annotators

from ..conftest import api_client_for
from ..factories import TaskFactory


def test_step_seeds_differ_by_step_and_session_and_are_none_unseeded():
    assert live.step_seed(None, 3) is None
    seeds = {live.step_seed(seed, index) for seed in (0, 1, 2) for index in range(4)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
    assert live.step_seed(7, 2) == live.step_seed(7, 2)


@pytest.mark.django_db(transaction=True)
def test_a_seeded_session_gets_the_same_sampled_proposals_for_a_step_every_time(policy_url, settings, make_user):
    from flywheel.models import ModelVersion

    settings.LIVE_CANDIDATES, settings.LIVE_TEMPERATURE, settings.LIVE_MAX_TOKENS = 3, 1.0, 80
    model = ModelVersion.objects.create(name="tiny", checkpoint_uri="x", endpoint_url=policy_url,
                                        served_name="tiny-uitars")  # fmt: skip
    trajectory = Trajectory.objects.create(task=TaskFactory(), annotator=make_user(Role.ANNOTATOR),
                                           mode="interactive", model_version=model, screen_width=644,
                                           screen_height=420)  # fmt: skip
    session = LiveSession.objects.create(trajectory=trajectory, status="active", model_width=644, model_height=420,
                                         proposal_seed=11)  # fmt: skip
    buffer = io.BytesIO()
    Image.new("RGB", (644, 420), "gray").save(buffer, "JPEG")
    session.observation.save("obs.jpg", ContentFile(buffer.getvalue()))

    def proposals() -> list[str]:
        live.propose(session.pk, 0)
        row = LiveSession.objects.get(pk=session.pk)
        assert row.proposals == LiveSession.Proposals.READY, row.proposal_error
        LiveSession.objects.filter(pk=session.pk).update(proposals=LiveSession.Proposals.PENDING, candidates=[])
        return [c["raw"] for c in row.candidates]

    first = proposals()
    assert len(first) == 3
    assert proposals() == first  # the sampled ones too, not only the greedy first


def test_the_api_stores_a_new_sessions_seed_and_refuses_a_bad_one(db, make_user):
    from flywheel.models import ModelVersion

    ModelVersion.objects.create(name="m", checkpoint_uri="a", endpoint_url="http://127.0.0.1:9/v1").promote()
    annotator = simulated_annotators(1)[0]
    task = TaskFactory(metadata={"suite": "click-button", "seed": 4, "difficulty": 1})
    client = api_client_for(annotator)
    for bad in (-1, 2**31, "x"):
        response = client.post(reverse("live-open"), {"task": task.pk, "seed": bad}, format="json")
        assert response.status_code == 400 and "seed" in response.json()["errors"]
    seed = session_seed(0, task)
    response = client.post(reverse("live-open"), {"task": task.pk, "seed": seed}, format="json")
    assert response.status_code == 201
    assert LiveSession.objects.get(trajectory_id=response.json()["trajectory"]).proposal_seed == seed
    assert session_seed(0, task) == seed != session_seed(1, task)
