"""The iteration page: its status panel polls while the iteration runs and, once it has ended, has the whole page
drawn again, so the routes, held-back list and store versions drawn before the end are not left stale."""

from __future__ import annotations

import random

import pytest
from django.urls import reverse

from annotation_app.models import Role
from flywheel.iterations import run_iteration, start_iteration
from flywheel.models import Stage

from .helpers import population

pytestmark = pytest.mark.django_db


def test_the_page_is_drawn_again_once_the_iteration_it_watched_has_ended(client, make_user):
    population(random.Random(3), 12)
    iteration = start_iteration(None, enqueue=False, stages=[Stage.VALIDATE])
    client.force_login(make_user(Role.ML_ENGINEER))
    url = reverse("flywheel-iteration", args=[iteration.pk])
    page = client.get(url).content.decode()
    assert f"{url}?seen=running" in page  # drawn while queued: the status panel says so when it polls
    run_iteration(iteration.pk)
    polled = client.get(f"{url}?seen=running", HTTP_HX_REQUEST="true")
    assert polled.status_code == 204 and polled["HX-Refresh"] == "true"
    fresh = client.get(url).content.decode()
    assert "seen=running" not in fresh and "every 2s" not in fresh  # an ended iteration's page polls no more
    assert client.get(url, HTTP_HX_REQUEST="true").status_code == 200
