"""The annotation queue: priority order, one task per annotator, skip, completion, expiry, and no double hand-outs."""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection
from django.utils import timezone

from annotation_app import task_queue
from annotation_app.models import Assignment, Role, Task

from .factories import TaskFactory, UserFactory


def test_next_task_takes_the_most_important_pending_task(annotator):
    TaskFactory(importance=1)
    wanted = TaskFactory(importance=5)
    TaskFactory(importance=9, status=Task.Status.ARCHIVED)
    assignment = task_queue.next_task(annotator)
    assert assignment.task == wanted
    wanted.refresh_from_db()
    assert wanted.status == Task.Status.ASSIGNED


def test_next_task_returns_the_current_assignment_until_it_is_done(annotator):
    TaskFactory.create_batch(3)
    first = task_queue.next_task(annotator)
    assert task_queue.next_task(annotator) == first
    assert Assignment.objects.filter(annotator=annotator, status="active").count() == 1


def test_skip_hands_the_task_back_and_never_offers_it_again(annotator, make_user):
    a, b = TaskFactory(importance=2), TaskFactory(importance=1)
    assert task_queue.next_task(annotator).task == a
    assert task_queue.skip_current(annotator).task == b
    a.refresh_from_db()
    assert a.status == Task.Status.PENDING
    # Someone else gets the skipped task; the skipper doesn't.
    assert task_queue.next_task(make_user(Role.ANNOTATOR)).task == a
    task_queue.complete_assignment(annotator, b)
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.next_task(annotator)


def test_empty_queue_raises(annotator):
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.next_task(annotator)


def test_stale_assignments_are_released(annotator):
    task = TaskFactory()
    assignment = task_queue.next_task(annotator)
    Assignment.objects.filter(pk=assignment.pk).update(assigned_at=timezone.now() - timedelta(hours=30))
    assert task_queue.release_stale_assignments(timedelta(hours=24)) == 1
    task.refresh_from_db()
    assignment.refresh_from_db()
    assert (task.status, assignment.status) == (Task.Status.PENDING, Assignment.Status.EXPIRED)
    assert task_queue.release_stale_assignments(timedelta(hours=24)) == 0


def test_database_forbids_one_annotator_holding_a_task_twice(annotator, make_user):
    task = TaskFactory(required_annotations=2)
    Assignment.objects.create(task=task, annotator=annotator)
    Assignment.objects.create(task=task, annotator=make_user())  # k = 2: a second annotator may hold it
    with pytest.raises(IntegrityError):
        Assignment.objects.create(task=task, annotator=annotator)


@pytest.mark.django_db(transaction=True)
def test_concurrent_annotators_never_get_the_same_task():
    """Many annotators ask at the same instant, each on its own connection: every task goes to exactly one."""
    n_annotators, n_tasks = 16, 40
    annotators = [UserFactory(role=Role.ANNOTATOR) for _ in range(n_annotators)]
    TaskFactory.create_batch(n_tasks)
    barrier = threading.Barrier(n_annotators)
    claimed: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(user):
        try:
            barrier.wait()
            for _ in range(2):  # claim, finish, claim again
                assignment = task_queue.next_task(user)
                with lock:
                    claimed.append((user.pk, assignment.task_id))
                task_queue.complete_assignment(user, assignment.task)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(u,)) for u in annotators]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    task_ids = [task for _, task in claimed]
    assert len(task_ids) == 2 * n_annotators
    assert len(set(task_ids)) == len(task_ids), "a task was handed to two annotators"
    assert Task.objects.filter(status=Task.Status.COMPLETED).count() == 2 * n_annotators


def test_a_skip_stands_when_nothing_is_left(annotator):
    only = TaskFactory()
    task_queue.next_task(annotator)
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.skip_current(annotator)
    only.refresh_from_db()
    assert only.status == Task.Status.PENDING
    assert Assignment.objects.get(task=only).status == Assignment.Status.SKIPPED


def test_claiming_takes_few_queries(annotator, django_assert_max_num_queries):
    TaskFactory.create_batch(3)
    task_queue.next_task(annotator)
    with django_assert_max_num_queries(2):
        task_queue.next_task(annotator)  # the current assignment, task included
    # Savepoint, lock, current, skip (task row, assignment, status), claim (hand-out count and gold rates for the gold
    # draw, the task, a second query when the draw's kind has none left), hold, status: 14 at most, however many
    # tasks there are.
    with django_assert_max_num_queries(14):
        assignment = task_queue.skip_current(annotator)
    with django_assert_max_num_queries(0):
        assert assignment.task.instruction


def test_a_task_asking_for_k_goes_to_k_different_annotators(make_user):
    task = TaskFactory(required_annotations=3, importance=5)
    later = TaskFactory(importance=1)
    a, b, c, d = (make_user(Role.ANNOTATOR) for _ in range(4))
    assert task_queue.next_task(a).task == task
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING  # two slots still open
    assert task_queue.next_task(b).task == task
    assert task_queue.next_task(c).task == task
    task.refresh_from_db()
    assert task.status == Task.Status.ASSIGNED
    assert task_queue.next_task(d).task == later  # all three slots are held
    task_queue.complete_assignment(a, task)
    task_queue.complete_assignment(b, task)
    task.refresh_from_db()
    assert task.status == Task.Status.ASSIGNED  # c still works on it
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.skip_current(c)  # nothing else is left for c
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING  # c's slot is open again, for someone else
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.next_task(a)  # a did it already: never the same annotator twice
    task_queue.complete_assignment(d, later)
    assert task_queue.next_task(d).task == task
    task_queue.complete_assignment(d, task)
    task.refresh_from_db()
    assert task.status == Task.Status.COMPLETED
    assert Assignment.objects.filter(task=task, status="completed").count() == 3


def test_a_requeued_full_task_is_handed_to_one_more_annotator(make_user):
    task = TaskFactory(required_annotations=2)
    first, second, third, fourth = (make_user(Role.ANNOTATOR) for _ in range(4))
    for user in (first, second):
        task_queue.next_task(user)
        task_queue.complete_assignment(user, task)
    task.refresh_from_db()
    assert task.status == Task.Status.COMPLETED
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PENDING)  # what a lead's requeue does
    task_queue.next_task(third)
    task.refresh_from_db()
    assert task.status == Task.Status.ASSIGNED
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.next_task(fourth)
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.skip_current(third)  # their skip reopens it: the lead still wants one more
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING
    assert task_queue.next_task(fourth).task == task


def test_raising_k_reopens_a_completed_task(annotator):
    task = TaskFactory()
    task_queue.next_task(annotator)
    task_queue.complete_assignment(annotator, task)
    Task.objects.filter(pk=task.pk).update(required_annotations=2)
    assert task_queue.settle_task(task).status == Task.Status.PENDING
    Task.objects.filter(pk=task.pk).update(required_annotations=1)
    assert task_queue.settle_task(task).status == Task.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("k", [2, 3])
def test_concurrent_annotators_fill_k_slots_and_never_take_a_task_twice(k):
    """16 annotators claim at once, on their own connections, tasks asking for k: no task ever has more than k
    holders, none is held twice by one annotator, and exactly those with k submissions are completed."""
    n_annotators, n_tasks = 16, 20
    annotators = [UserFactory(role=Role.ANNOTATOR) for _ in range(n_annotators)]
    TaskFactory.create_batch(n_tasks, required_annotations=k)
    barrier = threading.Barrier(n_annotators)
    claimed: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(user):
        try:
            barrier.wait()
            for _ in range(2):
                assignment = task_queue.next_task(user)
                with lock:
                    claimed.append((user.pk, assignment.task_id))
                task_queue.complete_assignment(user, assignment.task)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(u,)) for u in annotators]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(claimed) == 2 * n_annotators
    assert len(set(claimed)) == len(claimed), "an annotator was handed the same task twice"
    per_task: dict[int, int] = {}
    for _, task_id in claimed:
        per_task[task_id] = per_task.get(task_id, 0) + 1
    assert max(per_task.values()) <= k, "a task was handed to more than k annotators"
    completed = {t for t, n in per_task.items() if n == k}
    assert set(Task.objects.filter(status=Task.Status.COMPLETED).values_list("pk", flat=True)) == completed
    assert Task.objects.filter(status=Task.Status.ASSIGNED).count() == 0
