"""Simulated annotators without servers: who they are, which tasks they may name, who may read the oracle's state,
and the acceptance figure."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app import simulated
from annotation_app.live import sessions as live
from annotation_app.models import Assignment, LiveSession, Role, Step, Task, Trajectory
from annotation_app.trajectories import Conflict
from flywheel.models import ModelVersion

from ..conftest import ROLES, api_client_for
from ..factories import TaskFactory, TrajectoryFactory


def test_simulated_annotators_are_created_once_with_tokens(db, make_user):
    first = simulated.simulated_annotators(2)
    again = simulated.simulated_annotators(3)
    assert [u.username for u in first] == ["sim-annotator-1", "sim-annotator-2"]
    assert [u.pk for u in again[:2]] == [u.pk for u in first] and again[2].username == "sim-annotator-3"
    assert all(u.is_simulated and u.role == Role.ANNOTATOR and not u.has_usable_password() for u in again)
    assert api_client_for(again[0]).get(reverse("me")).status_code == 200
    with pytest.raises(ValueError, match="at least one"):
        simulated.simulated_annotators(0)


def test_a_person_with_a_simulated_name_is_not_taken_over(db, make_user):
    make_user(Role.ANNOTATOR, username="sim-annotator-1")
    with pytest.raises(Conflict, match="not a simulated annotator"):
        simulated.simulated_annotators(1)


def test_claiming_a_named_task(db, make_user):
    sim, other_sim = simulated.simulated_annotators(2)
    person = make_user(Role.ANNOTATOR)
    first, second = TaskFactory(), TaskFactory()
    held = simulated.claim(sim, first)
    assert held.status == Assignment.Status.ACTIVE and Task.objects.get(pk=first.pk).status == Task.Status.ASSIGNED
    assert simulated.claim(sim, first).pk == held.pk  # claiming again is a no-op
    with pytest.raises(Conflict, match="someone else"):
        simulated.claim(other_sim, first)
    simulated.claim(sim, second)  # the first task goes back to the pool
    held.refresh_from_db()
    assert held.status == Assignment.Status.SKIPPED and Task.objects.get(pk=first.pk).status == Task.Status.PENDING
    with pytest.raises(Conflict, match="people take tasks from the queue"):
        simulated.claim(person, first)
    archived = TaskFactory(status=Task.Status.ARCHIVED)
    with pytest.raises(Conflict, match="archived"):
        simulated.claim(other_sim, archived)


def test_only_simulated_annotators_open_a_named_task(db, make_user):
    task = TaskFactory()
    person = make_user(Role.ANNOTATOR)
    response = api_client_for(person).post(reverse("live-open"), {"task": task.pk}, format="json")
    assert response.status_code == 403 and "queue" in response.json()["detail"]
    sim = simulated.simulated_annotators(1)[0]
    response = api_client_for(sim).post(reverse("live-open"), {"task": 10**9}, format="json")
    assert response.status_code == 404
    response = api_client_for(sim).post(reverse("live-open"), {"task": "x"}, format="json")
    assert response.status_code == 400 and "task" in response.json()["errors"]
    response = api_client_for(sim).post(reverse("live-open"), {"task": task.pk}, format="json")
    assert response.status_code == 409 and "No annotation model is active" in response.json()["detail"]
    assert Assignment.objects.get(task=task).annotator == sim  # claimed; the session waits for a model


def _session_of(owner, *, status=LiveSession.Status.ACTIVE, metadata=None) -> Trajectory:
    task = TaskFactory(metadata=metadata or {"suite": "click-button", "seed": 1, "split": "train", "difficulty": 1})
    trajectory = TrajectoryFactory(task=task, annotator=owner, mode=Trajectory.Mode.INTERACTIVE)
    LiveSession.objects.create(trajectory=trajectory, status=status, model_width=100, model_height=80)
    return trajectory


@pytest.mark.parametrize("role", [*ROLES, "simulated (not the owner)"])
def test_oracle_state_is_for_the_simulated_owner_only(role, make_user, settings):
    """Every person gets 403 (the owner too, if a person: it is the answer key), anonymous 401, another simulated
    annotator 404 like the rest of the live API."""
    settings.SANDBOX_URL = "http://127.0.0.1:9"
    sim, other_sim = simulated.simulated_annotators(2)
    owners = {"anonymous": sim, "simulated (not the owner)": sim}
    caller = {"anonymous": None, "simulated (not the owner)": other_sim}
    if role not in caller:
        caller[role] = make_user(role)
        owners[role] = caller[role] if role in (Role.ANNOTATOR, "superuser") else sim
    trajectory = _session_of(owners[role])
    response = api_client_for(caller[role]).get(reverse("live-oracle-state", args=[trajectory.pk]))
    expected = {"anonymous": 401, "simulated (not the owner)": 404}.get(role, 403)
    assert response.status_code == expected, response.content[:300]


def test_the_simulated_owner_gets_past_the_checks(db, settings):
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nothing listens: past the permission check, a clear 503
    sim = simulated.simulated_annotators(1)[0]
    client = api_client_for(sim)
    active = _session_of(sim)
    response = client.get(reverse("live-oracle-state", args=[active.pk]))
    assert response.status_code == 503 and "did not answer" in response.json()["detail"]
    starting = _session_of(sim, status=LiveSession.Status.STARTING)
    response = client.get(reverse("live-oracle-state", args=[starting.pk]))
    assert response.status_code == 409 and "not running" in response.json()["detail"]
    not_suite = _session_of(sim, metadata={"source": "elsewhere"})
    response = client.get(reverse("live-oracle-state", args=[not_suite.pk]))
    assert response.status_code == 409 and "no oracle" in response.json()["detail"]


def test_acceptance_counts_steps_with_candidates(db):
    shown = [{"thought": "", "action_text": "wait()", "actions": [], "points": [], "raw": "", "error": "", "model": ""}]
    one, two = TrajectoryFactory(), TrajectoryFactory()
    Step.objects.create(trajectory=one, index=0, action_text="wait()", candidates=shown, chosen_candidate=0)
    Step.objects.create(trajectory=one, index=1, action_text="wait()", candidates=shown, source=Step.Source.HUMAN)
    Step.objects.create(trajectory=two, index=0, action_text="wait()", candidates=[], source=Step.Source.HUMAN)
    Step.objects.create(trajectory=TrajectoryFactory(), index=0, action_text="wait()", candidates=shown,
                        chosen_candidate=0)  # fmt: skip
    figures = simulated.acceptance([one.pk, two.pk])
    assert figures == {"trajectories": 2, "steps": 3, "total": 2, "accepted": 1, "overridden": 1, "rate": 0.5}
    assert simulated.acceptance([two.pk])["rate"] is None and simulated.acceptance([])["steps"] == 0


def test_live_trajectories_of_simulated_annotators_are_labelled_everywhere(db, make_user, client):
    ModelVersion.objects.create(name="m", checkpoint_uri="x", endpoint_url="http://127.0.0.1:9/v1").promote()
    sim, person = simulated.simulated_annotators(1)[0], make_user(Role.ANNOTATOR)
    theirs, mine = TaskFactory(), TaskFactory()
    by_sim = live.open_live(sim, simulated.claim(sim, theirs).task).trajectory
    Assignment.objects.create(task=mine, annotator=person)
    by_person = live.open_live(person, mine).trajectory
    assert Trajectory.objects.get(pk=by_sim.pk).simulated and not Trajectory.objects.get(pk=by_person.pk).simulated

    client.force_login(make_user("superuser"))
    listed = client.get(reverse("lead-trajectories")).content.decode()
    assert listed.count('class="pill simulated"') == 1
    assert 'class="pill simulated"' in client.get(reverse("trajectory", args=[by_sim.pk])).content.decode()
    assert 'class="pill simulated"' not in client.get(reverse("trajectory", args=[by_person.pk])).content.decode()
    admin = client.get(reverse("admin:annotation_app_trajectory_changelist"), {"simulated__exact": "1"})
    assert admin.status_code == 200 and [t.pk for t in admin.context["cl"].result_list] == [by_sim.pk]


def test_an_override_is_written_as_the_demonstrations_are():
    """The simulated annotator's own action reads like a bootstrap demonstration: a click on an outlined element
    names its line and goes to its centre in the model frame; without an outline the point is only mapped."""
    from annotation_app.simulated import override
    from sandbox.coordinates import mapping_for

    frame = mapping_for(1280, 800, 1288, 812)
    outline = [{"role": "button", "text": "Save", "value": None, "checked": None, "focused": False,
                "x": 100.0, "y": 200.0, "w": 80.0, "h": 40.0}]  # fmt: skip
    body = override("click(start_box='(110,205)')", frame, outline)
    assert body == {"thought": 'I click button "Save" (141,223).',
                    "action_text": "click(start_box='<|box_start|>(141,223)<|box_end|>')"}  # fmt: skip
    typed = override("type(content='forest\\n')", frame, outline)
    assert typed["thought"] == 'I type "forest\\n".' and typed["action_text"] == "type(content='forest\\n')"
    bare = override("click(start_box='(110,205)')", frame, [])
    assert bare["thought"] == "I click the target."
    assert bare["action_text"] == "click(start_box='<|box_start|>(111,208)<|box_end|>')"
