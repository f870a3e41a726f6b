"""The curation page, its forms' answers to bad input (4xx with the reason, shown by htmx), the flag filter on the
lead's trajectory list, and the review page's fragment (`curation_for` + templates/curation/_trajectory_flags.html)."""

from __future__ import annotations

from datetime import timedelta
from html import unescape

import pytest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from annotation_app.curation.dedup import dedup_pending
from annotation_app.curation.flags import curation_for
from annotation_app.curation.models import VerificationRun
from annotation_app.curation.verify import start_verification
from annotation_app.models import Role, Trajectory

from ..factories import TaskFactory
from .helpers import make_trajectory, picture

pytestmark = pytest.mark.django_db
CLICK, DONE = "click(start_box='(200,300)')", "finished(content='done')"


@pytest.fixture
def lead_client(client, make_user):
    client.force_login(make_user(Role.DATA_LEAD))
    return client


@pytest.fixture
def flagged(media):
    """Two duplicates of one task (one replayed, with a divergent step 1), and a clean trajectory."""
    task, shots = TaskFactory(), [picture(1), picture(2)]
    a = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    b = make_trajectory(task, [(CLICK, shots[0]), (DONE, shots[1])])
    clean = make_trajectory(TaskFactory(), [(CLICK, shots[0])])
    dedup_pending()
    VerificationRun.objects.create(
        trajectory=a, status=VerificationRun.Status.FLAGGED, threshold=10, divergent_steps=[1], executable=True,
        distances=[{"index": 0, "distance": 2}, {"index": 1, "distance": 30}], evaluator_score=1.0,
    )  # fmt: skip
    a.refresh_from_db()
    a.flags = [*a.flags, {"kind": "divergent_steps", "steps": [1], "detail": "step(s) 1 look different", "run": 1}]
    a.save()
    return a, b, clean


def test_the_page_shows_runs_groups_and_counts(lead_client, flagged):
    a, b, _ = flagged
    html = lead_client.get(reverse("curation")).content.decode()
    assert f"#{a.pk}" in html and f"#{b.pk}" in html and "Flagged" in html
    assert "near duplicate" in html and "divergent steps" in html
    runs = lead_client.get(reverse("curation-runs"))
    assert runs.status_code == 200 and "hx-trigger" not in runs.content.decode()  # nothing active: no polling
    VerificationRun.objects.create(trajectory=b, threshold=10)
    assert 'hx-trigger="every 2s"' in lead_client.get(reverse("curation-runs")).content.decode()


@pytest.mark.parametrize(
    ("ids", "message"),
    [("", "Give at least one trajectory number."), ("12 abc", "'abc' is not a trajectory number."),
     ("999999", "Trajectory 999999 does not exist."), (" ".join(["1"] * 201), "At most 200 trajectories")],
)  # fmt: skip
def test_bad_verify_input_is_a_400_with_the_reason(lead_client, ids, message):
    response = lead_client.post(reverse("curation-verify"), {"ids": ids}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and message in unescape(response.content.decode())


def test_an_in_progress_trajectory_is_refused_on_the_page(lead_client, media):
    t = make_trajectory(TaskFactory(), [(CLICK, picture(1))], status=Trajectory.Status.IN_PROGRESS)
    response = lead_client.post(reverse("curation-verify"), {"ids": str(t.pk)})
    assert response.status_code == 400 and "only finished ones" in response.content.decode()
    assert not VerificationRun.objects.exists()


def test_the_trajectory_list_filters_by_flag(lead_client, flagged):
    a, b, clean = flagged
    url = reverse("lead-trajectories")

    def listed(flag: str) -> set[int]:
        page = lead_client.get(url, {"flag": flag}).context["page"]
        return {t.pk for t in page}

    assert listed("near_duplicate") == {a.pk, b.pk}
    assert listed("divergent_steps") == {a.pk}
    assert listed("not_executable") == set()
    assert clean.pk in listed("")
    bad = lead_client.get(url, {"flag": "nonsense"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "is not a curation flag" in bad.content.decode()


def test_the_review_fragment_shows_flags_divergent_steps_and_duplicates(flagged):
    a, b, _ = flagged
    info = curation_for(a)
    assert info["divergent_steps"] == [1] and info["distances"] == {0: 2, 1: 30}
    assert info["duplicates"] == [b.pk] and info["kept"] in (a.pk, b.pk)
    html = render_to_string("curation/_trajectory_flags.html", {"curation": info})
    assert 'data-step="1"' in html and 'data-flag="divergent_steps"' in html and f"#{b.pk}" in html
    assert "Never replayed" in render_to_string("curation/_trajectory_flags.html", {"curation": curation_for(b)})


def test_engineers_read_the_page_without_the_forms_and_a_stale_run_gives_way(client, make_user, media):
    client.force_login(make_user(Role.ML_ENGINEER))
    html = client.get(reverse("curation")).content.decode()
    assert "Data leads start verifications" in html and reverse("curation-verify") not in html
    t = make_trajectory(TaskFactory(), [(CLICK, picture(1))])
    stale = VerificationRun.objects.create(trajectory=t, threshold=10, status=VerificationRun.Status.RUNNING)
    VerificationRun.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=2))
    runs, problems = start_verification([t.pk], enqueue=False)
    assert problems == [] and len(runs) == 1
    stale.refresh_from_db()
    assert stale.status == VerificationRun.Status.ERROR and "never finished" in stale.errors[0]
