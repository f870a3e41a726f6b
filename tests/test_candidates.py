"""One shape for the model proposals recorded with a step: built and checked where candidates are written (the
steps API, the live session, the seed commands) and rendered from that shape on the trajectory page."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from annotation_app import task_queue
from annotation_app.candidates import FIELDS, CandidateError, candidate, check_candidates, from_proposal, to_screen
from annotation_app.models import Step, Trajectory
from sandbox.coordinates import ScreenMapping
from training.policy.client import parse_proposal

from .conftest import api_client_for
from .factories import TaskFactory

CLICK = "click(start_box='<|box_start|>(640,60)<|box_end|>')"


def test_a_candidate_is_built_from_its_text_and_checked():
    built = candidate(thought=" Click the address bar. ", action_text="click(start_box='(640,60)')")
    assert tuple(built) == FIELDS
    assert built == {
        "thought": "Click the address bar.", "action_text": CLICK, "actions": [{"type": "click", "point": [640, 60]}],
        "points": [[640, 60]], "raw": "", "error": "", "model": "",
    }  # fmt: skip
    with pytest.raises(CandidateError, match="not a valid UI-TARS action"):
        candidate(thought="t", action_text="click(start_box='(1,2)'")
    with pytest.raises(CandidateError, match="needs an 'action_text'"):
        candidate(thought="no action")
    assert candidate(raw="gibberish", error="does not parse")["action_text"] == ""  # an invalid one keeps its raw


def test_checking_rebuilds_derived_fields_and_names_what_is_wrong():
    sent = candidate(thought="t", action_text="wait()") | {"points": [[1, 2]], "actions": []}
    assert check_candidates([sent]) == [candidate(thought="t", action_text="wait()")]
    with pytest.raises(CandidateError, match=r"candidate 1: unknown key\(s\) 'action' \(the action goes in"):
        check_candidates([{"thought": "t", "action": "wait()"}])
    with pytest.raises(CandidateError, match="candidate 2: 'thought' must be a string"):
        check_candidates([{"action_text": "wait()"}, {"thought": 3, "action_text": "wait()"}])
    with pytest.raises(CandidateError, match="must be a list"):
        check_candidates({"thought": "t"})


def test_a_proposal_becomes_a_screen_pixel_candidate_when_its_step_is_stored():
    mapping = ScreenMapping(1280, 800)  # the model sees 1288x812
    proposal = parse_proposal("Thought: there.\nAction: click(start_box='(644,406)')", *mapping.model_size)
    shown = from_proposal(proposal, "tiny")
    assert shown["points"] == [[644, 406]] and shown["raw"].startswith("Thought: there.") and shown["model"] == "tiny"
    stored = to_screen(shown, mapping)
    assert stored["points"] == [list(mapping.to_screen(644, 406))] == [[640, 400]]
    assert stored["raw"] == shown["raw"]  # what the model wrote, verbatim
    off = from_proposal(parse_proposal("Thought: x\nAction: click(start_box='(5000,5)')", 1288, 812), "tiny")
    assert off["error"] and to_screen(off, mapping)["action_text"] == "" and to_screen(off, mapping)["raw"]


@pytest.fixture
def trajectory(annotator):
    TaskFactory()
    task = task_queue.next_task(annotator).task
    return Trajectory.objects.create(task=task, annotator=annotator, mode="interactive")


def test_the_steps_api_takes_and_gives_the_one_shape(trajectory):
    api = api_client_for(trajectory.annotator)
    url = reverse("trajectory-add-step", args=[trajectory.pk])
    sent = [{"thought": "Alternative.", "action_text": "click(start_box='(640,60)')"}]
    response = api.post(url, {"action_text": "wait()", "candidates": json.dumps(sent)}, format="multipart")
    assert response.status_code == 201, response.json()
    assert response.json()["candidates"] == [candidate(thought="Alternative.", action_text=CLICK)]
    old = [{"thought": "t", "action": "wait()"}]
    response = api.post(url, {"action_text": "wait()", "candidates": json.dumps(old)}, format="multipart")
    assert response.status_code == 400
    assert "the action goes in 'action_text'" in json.dumps(response.json()["errors"]["candidates"])
    bad = [{"thought": "t", "action_text": "fly()"}]
    response = api.post(url, {"action_text": "wait()", "candidates": json.dumps(bad)}, format="multipart")
    assert response.status_code == 400 and "not a valid UI-TARS action" in json.dumps(response.json())


def test_seeded_candidates_show_their_action_on_the_trajectory_page(db, lead):
    call_command("seed_demo", verbosity=0)
    step = Step.objects.exclude(candidates=[]).get(trajectory__annotator__username="annotator2")
    first = candidate(thought="Click the terminal first.", action_text="click(start_box='(640,400)')")
    assert step.candidates[0] == first
    client = api_client_for(lead)
    client.force_login(lead)
    page = client.get(reverse("trajectory", args=[step.trajectory_id])).content.decode()
    assert "Thought: Click the terminal first.\nAction: click(start_box=&#x27;&lt;|box_start|&gt;(640,400)" in page


def test_seed_bench_writes_the_one_shape(db):
    from annotation_app.management.commands.seed_bench import Command

    command = Command()
    command.rng = __import__("random").Random(3)
    trajectory = Trajectory.objects.create(task=TaskFactory(), mode="interactive")
    for step in command.make_steps(trajectory):
        assert step.action == {"actions": [check_candidates([{"action_text": step.action_text}])[0]["actions"][0]]}
        assert step.candidates == check_candidates(step.candidates)
