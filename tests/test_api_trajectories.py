"""Recording a trajectory through the API: steps with checked screenshots, recordings, submit, review."""

import hashlib
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from annotation_app import task_queue
from annotation_app.models import Assignment, Step, Task, Trajectory

from .conftest import api_client_for
from .factories import TaskFactory, TrajectoryFactory

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 32


@pytest.fixture
def held_task(annotator):
    TaskFactory()
    return task_queue.next_task(annotator).task


@pytest.fixture
def trajectory(api, held_task):
    response = api.post(reverse("trajectory-list"), {"task": held_task.pk, "mode": "interactive"}, format="json")
    assert response.status_code == 201, response.json()
    return Trajectory.objects.get(pk=response.json()["id"])


def _step(api, trajectory, **fields):
    data = {"action_text": "click(start_box='(10,20)')", "thought": "Click it.", **fields}
    return api.post(reverse("trajectory-add-step", args=[trajectory.pk]), data, format="multipart")


def test_queue_then_trajectory_then_steps_then_submit(api, trajectory, held_task, client):
    png = SimpleUploadedFile("screen.png", PNG, "image/png")
    response = _step(api, trajectory, screenshot=png, screenshot_sha256=hashlib.sha256(PNG).hexdigest(), index=0)
    assert response.status_code == 201, response.json()
    assert response.json()["index"] == 0 and response.json()["screenshot_url"].endswith("00000.png")
    # Multipart clients (screenshots) send JSON fields as JSON text; they are parsed, and checked.
    response = _step(
        api, trajectory, action_text="wait()", candidates=json.dumps([{"thought": "t", "action_text": "wait()"}])
    )
    assert response.status_code == 201 and response.json()["candidates"][0]["action_text"] == "wait()"
    assert response.json()["action"] == {"actions": [{"type": "wait"}]}
    response = _step(api, trajectory, candidates=json.dumps({"not": "a list"}))
    assert response.status_code == 400 and "candidates" in response.json()["errors"]
    response = api.post(reverse("trajectory-submit", args=[trajectory.pk]))
    assert response.status_code == 200 and response.json()["status"] == "submitted"
    held_task.refresh_from_db()
    assert held_task.status == Task.Status.COMPLETED
    assert Assignment.objects.get(task=held_task).status == Assignment.Status.COMPLETED
    detail = api.get(reverse("trajectory-detail", args=[trajectory.pk])).json()
    assert [s["index"] for s in detail["steps"]] == [0, 1]
    # The screenshot is served to its annotator, through the permission-checked media view.
    client.force_login(trajectory.annotator)
    served = client.get(detail["steps"][0]["screenshot_url"])
    assert served.status_code == 200 and b"".join(served.streaming_content) == PNG


def test_out_of_order_or_repeated_step_index_is_a_conflict(api, trajectory):
    assert _step(api, trajectory, index=0).status_code == 201
    response = _step(api, trajectory, index=0)
    assert response.status_code == 409 and "next step of this trajectory is 1" in response.json()["detail"]
    assert Step.objects.filter(trajectory=trajectory).count() == 1


@pytest.mark.parametrize(
    ("upload", "extra", "status", "message"),
    [
        (b"GIF89a" + b"\x00" * 20, {}, 415, "not a supported format"),
        (PNG, {"screenshot_sha256": "0" * 64}, 400, "checksum mismatch"),
        (b"", {}, 400, "empty"),
    ],
)
def test_bad_screenshots_are_refused_and_nothing_is_stored(api, trajectory, upload, extra, status, message):
    response = _step(api, trajectory, screenshot=SimpleUploadedFile("s.png", upload, "image/png"), **extra)
    assert response.status_code == status, response.json()
    assert message in json.dumps(response.json())
    assert not Step.objects.filter(trajectory=trajectory).exists()


def test_oversized_screenshot_gets_413(api, trajectory, settings):
    settings.MAX_SCREENSHOT_BYTES = 50
    response = _step(api, trajectory, screenshot=SimpleUploadedFile("s.png", PNG, "image/png"))
    assert response.status_code == 413 and "limit is 50 bytes" in response.json()["detail"]


def test_unknown_fields_and_wrong_content_type_are_refused(api, trajectory):
    response = _step(api, trajectory, colour="red")
    assert response.status_code == 400 and response.json()["errors"] == {"colour": ["Unknown field."]}
    response = api.post(
        reverse("trajectory-add-step", args=[trajectory.pk]), "action_text=wait()", content_type="text/plain"
    )
    assert response.status_code == 415 and "Unsupported media type" in response.json()["detail"]
    response = api.post(reverse("trajectory-list"), {"task": 999999, "mode": "interactive"}, format="json")
    assert response.status_code == 400 and "task" in response.json()["errors"]


def test_recordings_are_checked(api, trajectory):
    url = reverse("trajectory-add-recording", args=[trajectory.pk])
    events = b'{"t": 0.0, "type": "click", "x": 1, "y": 2}\n{"t": 0.5, "type": "key", "key": "a"}\n'
    response = api.post(
        url,
        {"audio": SimpleUploadedFile("a.wav", WAV), "events": SimpleUploadedFile("e.jsonl", events), "duration_s": 1.5},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["event_count"] == 2 and response.json()["audio_content_type"] == "audio/wav"
    bad_events = SimpleUploadedFile("e.jsonl", b'{"t": 0}\nnot json\n')
    response = api.post(url, {"events": bad_events}, format="multipart")
    assert response.status_code == 400 and "events line 2" in response.json()["detail"]
    response = api.post(url, {"audio": SimpleUploadedFile("a.wav", b"MZ\x90\x00" * 8)}, format="multipart")
    assert response.status_code == 415
    assert trajectory.recordings.count() == 1


def test_cannot_record_on_a_task_you_do_not_hold(api):
    task = TaskFactory()
    response = api.post(reverse("trajectory-list"), {"task": task.pk, "mode": "in_situ"}, format="json")
    assert response.status_code == 409 and "not assigned to you" in response.json()["detail"]


def test_submit_needs_a_step_and_happens_once(api, trajectory):
    response = api.post(reverse("trajectory-submit", args=[trajectory.pk]))
    assert response.status_code == 400 and "at least one step" in response.json()["detail"]


def test_review_sets_the_status(lead_api, annotator):
    trajectory = TrajectoryFactory(annotator=annotator)
    url = reverse("trajectory-add-review", args=[trajectory.pk])
    assert lead_api.post(url, {"verdict": "approve"}, format="json").status_code == 409  # still in progress
    Trajectory.objects.filter(pk=trajectory.pk).update(status=Trajectory.Status.SUBMITTED)
    response = lead_api.post(url, {"verdict": "approve", "score": 9}, format="json")
    assert response.status_code == 400 and "score" in response.json()["errors"]
    response = lead_api.post(url, {"verdict": "reject", "score": 2, "comment": "wrong cell"}, format="json")
    assert response.status_code == 201
    trajectory.refresh_from_db()
    assert trajectory.status == Trajectory.Status.REJECTED


def test_queue_endpoint(api, annotator):
    response = api.post(reverse("queue-next"), {}, format="json")
    assert response.status_code == 404 and "No pending tasks" in response.json()["detail"]
    first, second = TaskFactory(importance=2), TaskFactory(importance=1)
    assert api.post(reverse("queue-next"), {}, format="json").json()["task"]["id"] == first.pk
    assert api.post(reverse("queue-next"), format="json").json()["task"]["id"] == first.pk
    response = api.post(reverse("queue-next"), {"skip_current": True}, format="json")
    assert response.json()["task"]["id"] == second.pk
    assert api.post(reverse("queue-next"), {"skip": True}, format="json").status_code == 400
    assert api.post(reverse("queue-next"), b"{nope", content_type="application/json").status_code == 400


def test_model_registry_promote(make_user):
    engineer = make_user("ml_engineer")
    client = api_client_for(engineer)
    ids = [
        client.post(reverse("modelversion-list"), {"name": n, "checkpoint_uri": f"/ckpt/{n}"}, format="json").json()[
            "id"
        ]
        for n in ("v1", "v2")
    ]
    refused = client.post(reverse("modelversion-promote", args=[ids[0]]), format="json")
    assert refused.status_code == 409 and "has no endpoint URL" in refused.json()["detail"]  # it could not serve
    for model_id in ids:
        forced = client.post(reverse("modelversion-promote", args=[model_id]), {"force": True}, format="json")
        assert forced.json()["is_active"] is True
    active = [m["name"] for m in client.get(reverse("modelversion-list")).json()["results"] if m["is_active"]]
    assert active == ["v2"]
    assert (
        client.post(reverse("modelversion-list"), {"name": "v1", "checkpoint_uri": "x"}, format="json").status_code
        == 400
    )


def test_task_crud_validation(lead_api):
    response = lead_api.post(reverse("task-list"), {"instruction": "Open a tab", "difficulty": 7}, format="json")
    assert response.status_code == 400 and "difficulty" in response.json()["errors"]
    task_id = lead_api.post(reverse("task-list"), {"instruction": "Open a tab"}, format="json").json()["id"]
    child = lead_api.post(reverse("task-list"), {"instruction": "Then close it", "parent": task_id}, format="json")
    response = lead_api.patch(reverse("task-detail", args=[task_id]), {"parent": child.json()["id"]}, format="json")
    assert response.status_code == 400 and "ancestor" in json.dumps(response.json())
    TrajectoryFactory(task_id=task_id)
    response = lead_api.delete(reverse("task-detail", args=[task_id]))
    assert response.status_code == 409 and "archive" in response.json()["detail"]


def test_api_errors_never_leak_tracebacks(api):
    response = api.get("/api/no-such-endpoint/")
    assert response.status_code == 404 and response.json() == {"detail": "There is nothing here."}


def test_api_checks_setup_and_evaluator_like_import(lead_api):
    bad = {"instruction": "x", "setup_config": [{"parameters": {}}], "evaluator": {"func": "", "colour": 1}}
    response = lead_api.post(reverse("task-list"), bad, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "non-empty string 'type'" in errors["setup_config"][0]
    assert any("unknown field(s) colour" in e for e in errors["evaluator"])


def test_data_leads_archive_and_restore_tasks(lead_api, annotator):
    task, held = TaskFactory(), TaskFactory(importance=-1)
    url = reverse("task-detail", args=[task.pk])
    assert lead_api.patch(url, {"status": "archived"}, format="json").json()["status"] == "archived"
    assert lead_api.patch(url, {"status": "pending"}, format="json").json()["status"] == "pending"
    response = lead_api.patch(url, {"status": "completed"}, format="json")
    assert response.status_code == 400 and "Only 'pending' and 'archived'" in str(response.json())
    task_queue.next_task(annotator)  # takes `task`, the more important one
    response = lead_api.patch(url, {"status": "archived"}, format="json")
    assert response.status_code == 400 and "The task is assigned" in str(response.json())
    assert held.status == Task.Status.PENDING


def test_step_actions_are_parsed_by_the_grammar(api, trajectory):
    response = _step(api, trajectory, action_text="click(start_box='(10,20)')\n\ntype(content='hi\\n')")
    assert response.status_code == 201
    assert response.json()["action"] == {
        "actions": [{"type": "click", "point": [10, 20]}, {"type": "type", "content": "hi\n"}]
    }
    response = _step(api, trajectory, action_text="click(start_box='somewhere')")
    assert response.status_code == 400
    assert "Not a valid UI-TARS action: line 1, column 7: 'somewhere' is not a point" in str(response.json())
    response = _step(api, trajectory, action='{"type": "wait"}')
    assert response.status_code == 400 and response.json()["errors"] == {"action": ["Unknown field."]}
