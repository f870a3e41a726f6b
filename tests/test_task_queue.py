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


def test_database_forbids_two_active_assignments_of_one_task(annotator, make_user):
    task = TaskFactory()
    Assignment.objects.create(task=task, annotator=annotator)
    with pytest.raises(IntegrityError):
        Assignment.objects.create(task=task, annotator=make_user())


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
    with django_assert_max_num_queries(9):
        assignment = task_queue.skip_current(annotator)
    with django_assert_max_num_queries(0):
        assert assignment.task.instruction
