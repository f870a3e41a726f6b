"""The data lead's pool pages: live counts, every trajectory with filters, a task's page with edit/archive/requeue."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Assignment, Task, Trajectory

from .factories import AssignmentFactory, TaskFactory, TrajectoryFactory


@pytest.fixture
def lead_client(client, lead):
    client.force_login(lead)
    return client


def test_the_domain_filter_ignores_case_and_matches_part_of_the_name(lead_client):
    TaskFactory(domain="LibreOffice_Calc", instruction="sum a column")
    TaskFactory(domain="chrome", instruction="open a tab")
    body = lead_client.get(reverse("lead"), {"domain": "calc"}).content.decode()
    assert "sum a column" in body and "open a tab" not in body


def test_the_count_boxes_are_a_fragment_the_page_refreshes(lead_client):
    TaskFactory.create_batch(3)
    TaskFactory(status=Task.Status.ARCHIVED)
    page = lead_client.get(reverse("lead")).content.decode()
    assert reverse("lead-stats") in page and "every 10s" in page
    stats = lead_client.get(reverse("lead-stats")).content.decode()
    assert "<b>3</b><span>Pending</span>" in stats and "<b>1</b><span>Archived</span>" in stats


def test_every_trajectory_is_listed_and_the_filters_narrow_it(lead_client, make_user):
    alice, bob = make_user(username="alice"), make_user(username="bob")
    calc = TaskFactory(instruction="sum the column in calc")
    approved = TrajectoryFactory(task=calc, annotator=alice, status=Trajectory.Status.APPROVED)
    rejected = TrajectoryFactory(annotator=bob, status=Trajectory.Status.REJECTED, mode=Trajectory.Mode.IN_SITU)
    in_progress = TrajectoryFactory(annotator=bob)

    def listed(**params) -> set[int]:
        response = lead_client.get(reverse("lead-trajectories"), params, HTTP_HX_REQUEST="true")
        assert response.status_code == 200
        return {t.pk for t in response.context["page"]}

    assert listed() == {approved.pk, rejected.pk, in_progress.pk}  # reviewed ones stay reachable
    assert listed(status="rejected") == {rejected.pk}
    assert listed(annotator="BOB") == {rejected.pk, in_progress.pk}
    assert listed(mode="in_situ") == {rejected.pk}
    assert listed(q="CALC") == {approved.pk}
    assert listed(task=str(calc.pk)) == {approved.pk}
    page = lead_client.get(reverse("lead-trajectories")).content.decode()
    assert reverse("trajectory", args=[approved.pk]) in page and reverse("lead-task", args=[calc.pk]) in page


def test_bad_filters_are_a_400_with_the_reason_on_the_page(lead_client):
    response = lead_client.get(reverse("lead-trajectories"), {"since": "yesterday", "task": "abc"})
    body = response.content.decode()
    assert response.status_code == 400
    assert "yesterday&#x27; is not a date" in body and "takes a task number" in body


def test_annotators_see_no_one_elses_trajectories_here(client, annotator):
    client.force_login(annotator)
    assert client.get(reverse("lead-trajectories")).status_code == 403


def test_the_task_page_shows_config_evaluator_and_trajectories(lead_client):
    task = TaskFactory(
        setup_config=[{"type": "launch", "parameters": {"command": ["xterm"]}}],
        evaluator={"func": "exact_match", "result": {"type": "vm_command_line"}},
    )
    trajectory = TrajectoryFactory(task=task)
    body = lead_client.get(reverse("lead-task", args=[task.pk])).content.decode()
    assert "&quot;launch&quot;" in body and "exact_match" in body
    assert reverse("trajectory", args=[trajectory.pk]) in body
    bare = TaskFactory()
    assert "No evaluator" in lead_client.get(reverse("lead-task", args=[bare.pk])).content.decode()


def test_edit_archive_and_requeue(lead_client, annotator):
    task = TaskFactory(status=Task.Status.ASSIGNED)
    held = AssignmentFactory(task=task, annotator=annotator)
    change = reverse("lead-task-change", args=[task.pk])
    response = lead_client.post(change, {"action": "edit", "instruction": "New words", "difficulty": "4",
                                         "importance": "7", "domain": "mousepad"})  # fmt: skip
    assert response.status_code == 302
    task.refresh_from_db()
    assert (task.instruction, task.difficulty, task.importance, task.domain) == ("New words", 4, 7, "mousepad")

    assert lead_client.post(change, {"action": "archive"}).status_code == 302
    task.refresh_from_db()
    held.refresh_from_db()
    assert task.status == Task.Status.ARCHIVED and held.status == Assignment.Status.EXPIRED
    assert lead_client.post(change, {"action": "requeue"}).status_code == 302
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        ({"action": "edit", "difficulty": "9"}, "between 1 and 5"),
        ({"action": "edit", "importance": "lots"}, "whole numbers"),
        ({"action": "edit", "instruction": "  "}, "cannot be empty"),
        ({"action": "requeue"}, "already pending"),
        ({"action": "teleport"}, "Unknown action"),
    ],
)
def test_a_refused_change_stores_nothing_and_says_why(lead_client, form, reason):
    task = TaskFactory(instruction="Keep me", difficulty=2)
    response = lead_client.post(reverse("lead-task-change", args=[task.pk]), form)
    assert response.status_code == 400 and reason in response.content.decode()
    task.refresh_from_db()
    assert (task.instruction, task.difficulty, task.status) == ("Keep me", 2, Task.Status.PENDING)


def test_data_leads_reach_the_stores_and_the_model_registry_from_the_navigation(client, lead, engineer):
    """Leads may read the stores and models but not the flywheel overview, so they get their own entries; ML
    engineers reach both from the overview and see no duplicate entries."""
    stores, models = reverse("flywheel-stores"), reverse("flywheel-models")
    client.force_login(lead)
    nav = client.get(reverse("lead")).content.decode().split("<nav", 1)[1].split("</nav>", 1)[0]
    assert f'href="{stores}"' in nav and f'href="{models}"' in nav
    assert client.get(stores).status_code == 200 and client.get(models).status_code == 200
    client.force_login(engineer)
    page = client.get(reverse("flywheel")).content.decode()
    nav = page.split("<nav", 1)[1].split("</nav>", 1)[0]
    assert f'href="{stores}"' not in nav and f'href="{models}"' not in nav
