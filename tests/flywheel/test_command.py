"""`manage.py flywheel run|resume`: the stages by hand, and clear errors for bad arguments."""

from __future__ import annotations

import io
import random

import pytest
from django.core.management import CommandError, call_command

from flywheel.models import Iteration, Validation

from .helpers import population

pytestmark = pytest.mark.django_db


def test_run_validates_in_this_process_and_prints_the_outcome():
    pop = population(random.Random(31), 12)
    out = io.StringIO()
    call_command("flywheel", "run", "--stage", "validate", "--config", '{"v": {"threshold": 0.5}}', stdout=out)
    iteration = Iteration.objects.get()
    assert iteration.status == Iteration.Status.SUCCEEDED and iteration.config["v"]["threshold"] == 0.5
    assert f"iteration {iteration.pk}: succeeded" in out.getvalue() and '"sft_share"' in out.getvalue()
    assert Validation.objects.filter(iteration=iteration).count() == len(pop.in_scope)
    again = io.StringIO()
    call_command("flywheel", "resume", str(iteration.pk), stdout=again)  # finished: nothing to do, nothing doubled
    assert Validation.objects.count() == len(pop.in_scope)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "{nope"], "--config is not JSON"),
        (["--stage", "ppo"], "need a base model with a checkpoint"),
        (["--base-model", "ghost"], "no model named 'ghost'"),
        (["--from", "yesterday"], "--from is not an ISO date-time"),
        (["--config", '{"v": {"weights": {"vibes": 1}}}'], "unknown V component"),
    ],
)
def test_bad_arguments_are_command_errors(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("flywheel", "run", *args, stdout=io.StringIO())
    assert not Iteration.objects.exists()
