"""Near-duplicate grouping across the store: exact and near copies of a trajectory (same task, same actions, points
a few pixels apart, the same screens re-encoded) are grouped with one kept; different screens, actions or tasks are
not; a trajectory whose steps change leaves its group; one trajectory costs the same queries in a bigger store."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from annotation_app.curation.dedup import dedup_pending, dedup_store, dedup_trajectory, pending_ids
from annotation_app.curation.models import DuplicateGroup, TrajectorySignature
from annotation_app.models import Trajectory

from ..factories import TaskFactory
from .helpers import flags_of, make_trajectory, picture, reencoded

pytestmark = pytest.mark.django_db

CLICK = "click(start_box='(200,300)')"
CLICK_NEAR = "click(start_box='(207,296)')"  # 7 and 4 px away on a 1280x800 screen
TYPE = "type(content='hello\\n')"
DONE = "finished(content='done')"


@pytest.fixture
def shots():
    return [picture(1), picture(2), picture(3)]


def _near(trajectory: Trajectory) -> dict | None:
    flags = flags_of(trajectory, "near_duplicate")
    assert len(flags) <= 1
    return flags[0] if flags else None


def test_exact_and_near_copies_are_grouped_and_one_is_kept(media, shots):
    task = TaskFactory()
    steps = [(CLICK, shots[0]), (TYPE, shots[1]), (DONE, shots[2])]
    first = make_trajectory(task, steps)
    exact = make_trajectory(task, steps, status=Trajectory.Status.APPROVED)
    near = make_trajectory(task, [(CLICK_NEAR, reencoded(shots[0])), (TYPE, reencoded(shots[1])),
                                  (DONE, reencoded(shots[2]))])  # fmt: skip
    other_screens = make_trajectory(task, [(CLICK, picture(7)), (TYPE, picture(8)), (DONE, picture(9))])
    other_actions = make_trajectory(task, [(CLICK, shots[0]), (TYPE.replace("hello", "bye"), shots[1]),
                                           (DONE, shots[2])])  # fmt: skip
    far_click = make_trajectory(task, [("click(start_box='(600,300)')", shots[0]), (TYPE, shots[1]), (DONE, shots[2])])
    other_task = make_trajectory(TaskFactory(), steps)

    assert dedup_pending()["checked"] == 7
    group = DuplicateGroup.objects.get()
    assert set(group.members.values_list("trajectory_id", flat=True)) == {first.pk, exact.pk, near.pk}
    assert group.kept_id == exact.pk  # the approved one
    for member in (first, exact, near):
        flag = _near(member)
        assert flag["group"] == group.pk and flag["of"] == exact.pk and flag["keep"] == (member == exact)
    for alone in (other_screens, other_actions, far_click, other_task):
        assert _near(alone) is None
    assert pending_ids(100) == []
    assert dedup_pending() == {"checked": 0, "grouped": 0}  # incremental: nothing left to sign


def test_a_step_without_screenshot_makes_no_duplicate(media, shots):
    task = TaskFactory()
    a = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    b = make_trajectory(task, [(CLICK, shots[0]), (DONE, None)])
    assert dedup_trajectory(a.pk) is None and dedup_trajectory(b.pk) is None
    assert not DuplicateGroup.objects.exists()


def test_a_bridge_merges_groups_and_a_changed_trajectory_leaves(media, shots):
    task = TaskFactory()
    a = make_trajectory(task, [("click(start_box='(200,300)')", shots[0]), (DONE, shots[1])])
    c = make_trajectory(task, [("click(start_box='(240,300)')", shots[0]), (DONE, shots[1])])
    assert dedup_trajectory(a.pk) is None and dedup_trajectory(c.pk) is None  # 40 px apart: no duplicates
    b = make_trajectory(task, [("click(start_box='(220,300)')", shots[0]), (DONE, shots[1])])  # 20 px from each
    d = make_trajectory(task, [("click(start_box='(240,302)')", shots[0]), (DONE, shots[1])])
    group = dedup_trajectory(d.pk)
    assert group is not None and dedup_trajectory(b.pk) == group
    assert set(TrajectorySignature.objects.filter(group_id=group).values_list("pk", flat=True)) == {
        a.pk, b.pk, c.pk, d.pk
    }  # fmt: skip
    assert DuplicateGroup.objects.count() == 1
    # A reviewer's edit changes d's action: the whole-store pass re-signs it and it leaves the group.
    step = d.steps.get(index=0)
    step.action_text = "click(start_box='(900,700)')"
    step.save()
    assert dedup_store() == {"checked": 4, "grouped": 3}
    assert _near(d) is None and _near(a)["group"] == group
    # Two trajectories left alone dissolve their group.
    for t in (a, b):
        t.status = Trajectory.Status.ABANDONED
        t.save()
        dedup_trajectory(t.pk)
    assert not DuplicateGroup.objects.exists() and _near(c) is None


def test_one_trajectory_costs_the_same_queries_in_a_bigger_store(media, shots):
    """Candidates come from the (task, action_key) index: other tasks' and other actions' signatures are never read."""
    task = TaskFactory()
    first = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    probe = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    dedup_pending()
    with CaptureQueriesContext(connection) as small:
        dedup_trajectory(probe.pk, resign=True)
    others = [make_trajectory(task, [(f"click(start_box='({x},5)')", None)]) for x in range(300, 340)]
    TrajectorySignature.objects.bulk_create(
        TrajectorySignature(trajectory=t, task=task, action_key=f"{t.pk:064x}", points=[], hashes=[], digest="")
        for t in others
    )
    with CaptureQueriesContext(connection) as big:
        dedup_trajectory(probe.pk, resign=True)
    assert len(big) == len(small)
    assert _near(probe)["of"] == first.pk


def test_the_management_command_runs_both_passes(media, shots, settings):
    task = TaskFactory()
    a = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    out = io.StringIO()
    call_command("curate", "dedup", stdout=out)
    assert out.getvalue().strip() == "checked 2, in a duplicate group 1"
    out = io.StringIO()
    call_command("curate", "dedup", "--all", "--resign", stdout=out)
    assert out.getvalue().strip() == "checked 2, in a duplicate group 2"
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nothing answers: the run ends as an error, said in words
    out, err = io.StringIO(), io.StringIO()
    call_command("curate", "verify", str(a.pk), "999999", stdout=out, stderr=err)
    assert "Trajectory 999999 does not exist." in err.getvalue()
    assert f"trajectory {a.pk}: error" in out.getvalue() and "No sandbox session" in out.getvalue()
