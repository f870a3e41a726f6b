"""The three role pages with demo data, their htmx fragments, and login/logout."""

import pytest
from django.core.management import call_command
from django.urls import reverse

from annotation_app.models import Role, Task, Trajectory, User
from flywheel.models import ModelVersion


@pytest.fixture
def demo(db):
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)  # idempotent


def _login(client, username):
    assert client.login(username=username, password="demo-pass-123")


@pytest.mark.parametrize(
    ("username", "landing", "text"),
    [
        ("annotator", "/annotate/", "My queue"),
        ("lead", "/lead/", "Task pool"),
        ("engineer", "/flywheel/", "Model registry"),
    ],
)
def test_each_role_lands_on_its_page(client, demo, username, landing, text):
    _login(client, username)
    response = client.get("/", follow=True)
    assert response.redirect_chain[-1][0] == landing
    assert text in response.content.decode()


def test_demo_data_is_there_once(demo):
    assert User.objects.filter(username__in=["annotator", "lead", "engineer", "admin"]).count() == 4
    assert Task.objects.filter(external_id__startswith="demo2-").count() == 8
    assert ModelVersion.objects.filter(is_active=True).count() == 1
    assert Trajectory.objects.count() == 1


def test_annotator_takes_and_skips_tasks_with_htmx(client, demo):
    _login(client, "annotator")
    response = client.post(reverse("annotate-next"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Skip this task" in response.content.decode()
    first = Task.objects.get(assignments__annotator__username="annotator", assignments__status="active")
    client.post(reverse("annotate-next"), {"skip": "1"}, HTTP_HX_REQUEST="true")
    second = Task.objects.get(assignments__annotator__username="annotator", assignments__status="active")
    assert first != second
    assert "base.html" not in [t.name for t in response.templates]  # a fragment, not a whole page


def test_task_pool_filters_and_pages(client, demo):
    _login(client, "lead")
    response = client.get(reverse("lead"), {"q": "spreadsheet"}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert "Sum column B" in body and "bookmark" not in body
    assert client.get(reverse("lead"), {"page": "999", "status": "bogus"}).status_code == 200


def test_review_from_the_trajectory_page(client, demo):
    trajectory = Trajectory.objects.get()
    _login(client, "lead")
    page = client.get(reverse("trajectory", args=[trajectory.pk]))
    assert "Save review" in page.content.decode() and "date &gt; date.txt" in page.content.decode()
    assert client.post(reverse("trajectory-review", args=[trajectory.pk]), {"verdict": "maybe"}).status_code == 400
    response = client.post(reverse("trajectory-review", args=[trajectory.pk]), {"verdict": "approve", "score": "4"})
    assert response.status_code == 302
    trajectory.refresh_from_db()
    assert trajectory.status == Trajectory.Status.APPROVED


def test_engineer_promotes_a_model(client, demo):
    new = ModelVersion.objects.create(name="ui-tars-flywheel-1", checkpoint_uri="/ckpt/1")
    _login(client, "engineer")
    before = ModelVersion.objects.get(is_active=True)
    response = client.post(reverse("flywheel-promote", args=[new.pk]), follow=True)
    assert "was not promoted: it has no endpoint URL" in response.content.decode()  # it could not serve
    assert ModelVersion.objects.get(is_active=True) == before
    assert client.post(reverse("flywheel-promote", args=[new.pk]), {"force": "1"}).status_code == 302
    assert ModelVersion.objects.get(is_active=True) == new


def test_login_and_logout(client, demo):
    response = client.post(reverse("login"), {"username": "lead", "password": "wrong"})
    assert "didn't match" in response.content.decode()
    _login(client, "lead")
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("lead")).status_code == 302


def test_static_assets_are_local(client, demo):
    _login(client, "lead")
    body = client.get(reverse("lead")).content.decode()
    assert "/static/vendor/htmx.min.js" in body and "https://" not in body


def test_pages_open_their_websocket_on_daphne(client, demo, settings):
    _login(client, "lead")
    settings.WS_PUBLIC_PORT = "8001"
    assert 'data-events-url="ws://testserver:8001/ws/events/"' in client.get(reverse("lead")).content.decode()
    settings.WS_PUBLIC_PORT = ""  # behind a proxy that routes /ws/ to daphne
    assert 'data-events-url="/ws/events/"' in client.get(reverse("lead")).content.decode()


def test_trajectory_page_shows_the_proposals_of_each_live_step(client, lead):
    from .factories import StepFactory, TrajectoryFactory

    trajectory = TrajectoryFactory(mode=Trajectory.Mode.INTERACTIVE, status=Trajectory.Status.SUBMITTED)
    shown = [
        {"raw": "Thought: x\nAction: fly()", "thought": "", "action_text": "", "actions": [], "points": [],
         "error": "does not parse: unknown action 'fly'"},
        {"raw": "", "thought": "Open it", "action_text": "click(start_box='(1,2)')", "actions": [], "points": [[1, 2]],
         "error": ""},
    ]  # fmt: skip
    StepFactory(trajectory=trajectory, index=0, candidates=shown, chosen_candidate=1, model_latency_ms=812)
    StepFactory(trajectory=trajectory, index=1, candidates=shown, chosen_candidate=None, source="human")
    client.force_login(lead)
    page = client.get(reverse("trajectory", args=[trajectory.pk])).content.decode()
    assert "2 model proposals shown, number 2 accepted · model 812 ms" in page
    assert "2 model proposals shown, overridden" in page
    assert "invalid: does not parse: unknown action &#x27;fly&#x27;" in page


def test_the_demo_data_holds_the_task_suite_with_training_and_held_out_instances(demo):
    from sandbox.suite import families

    suite = Task.objects.exclude(metadata__suite=None)
    assert {t.metadata["suite"] for t in suite} == set(families())
    splits = {t.metadata["split"] for t in suite}
    assert splits == {"train", "heldout"}
    assert suite.count() == 3 * len(families())  # the second seed_demo imported nothing twice
    assert all(t.evaluator for t in suite)


def test_a_newcomer_is_first_handed_a_browser_task_the_default_agent_learnt(demo):
    """The default agent of scripts/run knows the suite's browser families, not the desktop demo tasks: a new
    annotator's first task is one of those, so the first live session shows proposals that make sense."""
    from annotation_app.task_queue import next_task
    from flywheel.demo_families import DEFAULT_AGENT_FAMILIES

    newcomer = User.objects.create_user("newcomer", password="x", role=Role.ANNOTATOR)
    task = next_task(newcomer).task
    assert task.metadata["suite"] in DEFAULT_AGENT_FAMILIES and task.metadata["split"] == "train"
    assert task.importance > max(t.importance for t in Task.objects.filter(external_id__startswith="demo2-"))
    Task.objects.filter(pk=task.pk).update(importance=-5)  # a data lead puts it last: the next start keeps that
    call_command("seed_demo", verbosity=0)
    assert Task.objects.get(pk=task.pk).importance == -5
