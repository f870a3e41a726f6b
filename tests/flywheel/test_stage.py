"""The validation+routing stage on PostgreSQL: nothing lost or routed twice, idempotent, resumable, cancellable,
scoped, with a number of queries that does not grow with the steps."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from annotation_app.consumers import role_group
from annotation_app.models import Trajectory
from flywheel.iterations import (
    Cancelled,
    IterationError,
    cancel_iteration,
    progress,
    run_iteration,
    start_iteration,
    validate_and_route,
)
from flywheel.models import DatasetVersion, Iteration, Route, Stage, Validation

from .helpers import population

pytestmark = pytest.mark.django_db


def _iteration(**kwargs: object) -> Iteration:
    kwargs.setdefault("stages", [Stage.VALIDATE])
    return start_iteration(None, enqueue=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_no_trajectory_is_lost_or_routed_twice(seed, make_user):
    rng = random.Random(seed)
    pop = population(
        rng, rng.randint(1, 60), steps=(0, 8), annotator=make_user("annotator"), reviewer=make_user("data_lead")
    )
    iteration = _iteration(config={"v": {"threshold": rng.choice([0.3, 0.6, 0.9])}})
    done = run_iteration(iteration.pk, chunk=rng.randint(1, 9))
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    rows = list(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", "route", "v"))
    ids = [pk for pk, _, _ in rows]
    assert len(ids) == len(set(ids)), "a trajectory was routed twice"
    assert set(ids) == pop.in_scope, "a trajectory in scope was lost (or one out of scope validated)"
    assert {pk for pk, route, _ in rows if route == Route.HELD} == pop.broken & pop.in_scope
    assert all(0.0 <= v <= 1.0 for _, _, v in rows)
    output = done.stages[Stage.VALIDATE]["output"]
    assert output["validated"] == len(pop.in_scope) == sum(output["routes"].values())
    assert done.stages[Stage.VALIDATE]["done"] == done.stages[Stage.VALIDATE]["total"] == len(pop.in_scope)
    # Running the stage again creates nothing twice.
    before = Validation.objects.count()
    validate_and_route(Iteration.objects.get(pk=iteration.pk), chunk=4)
    assert Validation.objects.count() == before


def test_queries_do_not_grow_with_the_number_of_steps():
    rng = random.Random(1)
    population(rng, 30, steps=(2, 2), domains=("few",))
    population(rng, 30, steps=(15, 15), domains=("many",))
    Trajectory.objects.update(status=Trajectory.Status.SUBMITTED)  # the same number in scope, so the same chunks
    counts = []
    for domain in ("few", "many"):
        iteration = _iteration(domains=[domain], scope=Iteration.Scope.ALL)
        iteration.scope_until = timezone.now()
        with CaptureQueriesContext(connection) as queries:
            validate_and_route(iteration, chunk=10)
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_cancel_stops_at_the_next_chunk_and_a_resume_completes_without_duplicates():
    rng = random.Random(2)
    pop = population(rng, 40, steps=(1, 3))
    iteration = _iteration()
    iteration.scope_until = timezone.now()
    iteration.save()

    def cancel_after_two_chunks(done: int, total: int) -> None:
        if done >= 10:
            cancel_iteration(iteration)
        progress(iteration, Stage.VALIDATE, done, total)

    with pytest.raises(Cancelled):
        validate_and_route(iteration, chunk=5, on_chunk=cancel_after_two_chunks)
    partial = Validation.objects.filter(iteration=iteration).count()
    assert partial == 10
    assert Iteration.objects.get(pk=iteration.pk).cancel_requested
    # Resuming (the crash case: the rows written so far are kept) validates the rest, each once.
    Iteration.objects.filter(pk=iteration.pk).update(cancel_requested=False)
    iteration.refresh_from_db()
    validate_and_route(iteration, chunk=7)
    ids = list(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", flat=True))
    assert len(ids) == len(set(ids)) and set(ids) == pop.in_scope


def test_a_cancelled_iteration_ends_cancelled_and_a_finished_one_cannot_be_cancelled():
    population(random.Random(3), 5)
    iteration = _iteration()
    cancel_iteration(iteration)
    iteration.refresh_from_db()
    assert iteration.status == Iteration.Status.CANCELLED  # it was still pending
    assert run_iteration(iteration.pk).status == Iteration.Status.CANCELLED
    assert not Validation.objects.filter(iteration=iteration).exists()
    with pytest.raises(IterationError, match="already cancelled"):
        cancel_iteration(iteration)


def test_a_running_iteration_asked_to_cancel_ends_cancelled():
    population(random.Random(4), 12)
    iteration = _iteration()
    Iteration.objects.filter(pk=iteration.pk).update(status=Iteration.Status.RUNNING)
    cancel_iteration(iteration)
    assert run_iteration(iteration.pk).status == Iteration.Status.CANCELLED


def test_scope_by_mode_domain_and_date():
    rng = random.Random(5)
    pop = population(rng, 60, domains=("chrome", "os"))
    finished = Trajectory.objects.filter(pk__in=pop.in_scope)
    old = list(finished.values_list("pk", flat=True)[:10])
    Trajectory.objects.filter(pk__in=old).update(submitted_at=timezone.now() - timedelta(days=30))
    iteration = _iteration(
        modes=["interactive", "rollout"], domains=["chrome"], date_from=timezone.now() - timedelta(days=1)
    )
    run_iteration(iteration.pk)
    expected = set(
        finished.filter(mode__in=["interactive", "rollout"], task__domain="chrome")
        .exclude(pk__in=old)
        .values_list("pk", flat=True)
    )
    assert set(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", flat=True)) == expected


def test_new_scope_skips_what_reached_a_store_and_retries_what_was_held():
    rng = random.Random(6)
    pop = population(rng, 30)
    first = _iteration()
    run_iteration(first.pk)
    # Mark the first iteration's SFT and CT routes as stored (what its export stage records).
    DatasetVersion.objects.create(kind="sft", number=1, iteration=first)
    DatasetVersion.objects.create(kind="ct", number=1, iteration=first)
    held = set(Validation.objects.filter(iteration=first, route=Route.HELD).values_list("trajectory_id", flat=True))
    later = population(rng, 5)
    second = _iteration()
    run_iteration(second.pk)
    seen = set(Validation.objects.filter(iteration=second).values_list("trajectory_id", flat=True))
    assert seen == held | later.in_scope
    assert pop.in_scope - held - seen == pop.in_scope - held  # nothing stored came back
    everything = _iteration(scope=Iteration.Scope.ALL)
    run_iteration(everything.pk)
    assert Validation.objects.filter(iteration=everything).count() == len(pop.in_scope | later.in_scope)


def test_trajectories_submitted_after_the_start_wait_for_the_next_iteration():
    rng = random.Random(7)
    population(rng, 10)
    iteration = _iteration()
    Iteration.objects.filter(pk=iteration.pk).update(scope_until=timezone.now() - timedelta(hours=1))
    run_iteration(iteration.pk)
    assert not Validation.objects.filter(iteration=iteration).exists()


def test_progress_is_pushed_over_the_websocket(monkeypatch):
    monkeypatch.setattr("flywheel.progress.PUSH_EVERY_S", 0.0)  # every chunk (by default at most 2 a second)
    population(random.Random(8), 8)
    iteration = _iteration()

    async def listen() -> list[dict]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(role_group("ml_engineer"), channel)
        try:
            await sync_to_async(run_iteration)(iteration.pk, chunk=3)
            events = []
            while not events or events[-1]["iteration"]["status"] != "succeeded":
                events.append(await asyncio.wait_for(layer.receive(channel), 10))
            return events
        finally:
            await layer.group_discard(role_group("ml_engineer"), channel)

    events = async_to_sync(listen)()
    assert {m["event"] for m in events} == {"flywheel_iteration"}
    progress_seen = [m["iteration"]["stages"]["validate"]["done"] for m in events]
    assert progress_seen == sorted(progress_seen) and 3 in progress_seen


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stages": ["ppo"]}, "need a base model with a checkpoint"),
        ({"stages": ["bogus"]}, "unknown stage"),
        ({"stages": ["export"]}, "export needs the validation"),
        ({"modes": ["telepathy"]}, "unknown mode"),
        ({"config": {"v": {"threshold": 3}}}, "config.v: threshold"),
        ({"config": {"export": {"coordinates": "polar"}}}, "coordinates must be one of"),
        ({"config": {"export": {"parquet_images": "base64"}}}, "parquet_images must be one of"),
        ({"config": {"export": {"zip": True}}}, "takes only 'coordinates' and 'parquet_images'"),
        ({"config": {"other": 1}}, "unknown config section"),
    ],
)
def test_starting_refuses_what_it_cannot_do(kwargs, message):
    with pytest.raises(IterationError, match=message):
        start_iteration(None, enqueue=False, **kwargs)
    assert not Iteration.objects.exists()


def test_abandoned_trajectories_are_never_in_scope():
    rng = random.Random(9)
    pop = population(rng, 20)
    abandoned = list(Trajectory.objects.filter(pk__in=pop.in_scope).values_list("pk", flat=True)[:5])
    Trajectory.objects.filter(pk__in=abandoned).update(status=Trajectory.Status.ABANDONED)
    iteration = _iteration()
    run_iteration(iteration.pk)
    validated = set(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", flat=True))
    assert validated == set(pop.in_scope) - set(abandoned)


def test_the_parquet_image_choice_is_recorded_on_the_iteration():
    iteration = start_iteration(None, enqueue=False, config={"export": {"parquet_images": "paths"}})
    assert iteration.config["export"] == {"coordinates": "absolute", "parquet_images": "paths"}
