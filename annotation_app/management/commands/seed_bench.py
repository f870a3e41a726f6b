"""Fill the database with a benchmark-sized task pool, trajectories with steps, and annotators with credentials.

Meant for a database of its own: bench/queue_load.py runs it with DATABASE_NAME=annotation_bench. The command itself
just uses the default database, so do not run it against data you care about.

Idempotent-ish: tasks (and trajectories) are only added up to the requested count; annotators, their API tokens
and fresh login sessions are (re)made on every run and written to --credentials-out as JSON.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token
from tqdm import tqdm

from annotation_app.candidates import candidate
from annotation_app.models import Assignment, Role, Step, Task, Trajectory, User
from annotation_app.trajectories import typed_action
from flywheel.models import ModelVersion

USERNAME_PREFIX = "bench-annotator-"
EXTERNAL_ID_PREFIX = "bench-"
DEFAULT_PASSWORD = "bench-pass-123"
AUTH_BACKEND = "django.contrib.auth.backends.ModelBackend"

DOMAINS = [
    ("chrome", Task.Platform.BROWSER),
    ("firefox", Task.Platform.BROWSER),
    ("libreoffice_calc", Task.Platform.DESKTOP),
    ("libreoffice_writer", Task.Platform.DESKTOP),
    ("libreoffice_impress", Task.Platform.DESKTOP),
    ("gimp", Task.Platform.DESKTOP),
    ("terminal", Task.Platform.DESKTOP),
    ("vs_code", Task.Platform.DESKTOP),
    ("thunderbird", Task.Platform.DESKTOP),
    ("os", Task.Platform.DESKTOP),
    ("settings", Task.Platform.MOBILE),
    ("contacts", Task.Platform.MOBILE),
    ("2048", Task.Platform.GAME),
]
VERBS = ["Open", "Rename", "Export", "Sort", "Bookmark", "Format", "Delete", "Move", "Create", "Configure"]
OBJECTS = [
    "the report for March",
    "every .csv file in Downloads",
    "the second slide's title",
    "the mail from billing@example.com",
    "column B of Sheet1",
    "the default search engine",
    "the project README",
    "the screenshot on the desktop",
]
TAILS = [
    "",
    " and save the result.",
    ", keeping the original formatting, then close the application.",
    " so that it matches the example shown in the attached reference file, then export it as PDF to the Documents "
    "folder.",
]
ACTIONS = [
    ("click(start_box='({x},{y})')", "click"),
    ("type(content='hello world')", "type"),
    ("hotkey(key='ctrl s')", "hotkey"),
    ("scroll(start_box='({x},{y})', direction='down')", "scroll"),
]
TASK_STATUS_WEIGHTS = [(Task.Status.PENDING, 80), (Task.Status.COMPLETED, 15), (Task.Status.ARCHIVED, 5)]
MODE_WEIGHTS = [(Trajectory.Mode.IN_SITU, 40), (Trajectory.Mode.INTERACTIVE, 40), (Trajectory.Mode.ROLLOUT, 20)]
TRAJECTORY_STATUS_WEIGHTS = [
    (Trajectory.Status.IN_PROGRESS, 15),
    (Trajectory.Status.SUBMITTED, 35),
    (Trajectory.Status.APPROVED, 35),
    (Trajectory.Status.REJECTED, 15),
]


def weighted(rng: random.Random, choices: list[tuple[Any, int]]) -> Any:
    return rng.choices([value for value, _ in choices], weights=[weight for _, weight in choices])[0]


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=100_000, help="Tasks the pool should hold (default 100000).")
        parser.add_argument("--trajectories", type=int, default=10_000, help="Trajectories (default 10000).")
        parser.add_argument("--annotators", type=int, default=50, help="Annotator accounts (default 50).")
        parser.add_argument("--password", default=DEFAULT_PASSWORD, help="The annotators' password.")
        parser.add_argument("--credentials-out", type=Path, help="Write usernames, tokens and session keys here.")
        parser.add_argument("--batch-size", type=int, default=5000)
        parser.add_argument("--seed", type=int, default=0, help="Random seed, for a reproducible data set.")
        parser.add_argument(
            "--users-only", action="store_true", help="Only make annotators, tokens and sessions; add no data."
        )
        parser.add_argument(
            "--reset-queue",
            action="store_true",
            help="Drop the bench annotators' active/skipped/expired assignments and put their tasks back in the pool.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.rng = random.Random(options["seed"])
        self.batch_size = options["batch_size"]
        annotators = self.ensure_annotators(options["annotators"], options["password"])
        if not options["users_only"]:
            self.seed_tasks(options["tasks"])
            self.seed_trajectories(options["trajectories"], annotators)
        if options["reset_queue"]:
            self.reset_queue(annotators)
        credentials = self.credentials(annotators, options["password"])
        if options["credentials_out"]:
            path: Path = options["credentials_out"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(credentials, indent=2))
            path.chmod(0o600)
            self.stdout.write(f"Credentials of {len(annotators)} annotators written to {path}.")
        counts = credentials["counts"]
        self.stdout.write(
            self.style.SUCCESS(
                "Bench data ready: "
                + ", ".join(f"{n} {name}" for name, n in counts.items())
                + f" in database {settings.DATABASES['default']['NAME']!r}."
            )
        )

    # --- annotators ----------------------------------------------------------------------------------------------

    def ensure_annotators(self, count: int, password: str) -> list[User]:
        usernames = [f"{USERNAME_PREFIX}{i}" for i in range(count)]
        existing = set(User.objects.filter(username__in=usernames).values_list("username", flat=True))
        hashed = make_password(password)  # hashing is slow on purpose: once for everyone
        User.objects.bulk_create(
            [
                User(username=name, role=Role.ANNOTATOR, password=hashed, email=f"{name}@bench.invalid")
                for name in usernames
                if name not in existing
            ]
        )
        # Accounts from an earlier run keep working with the password given now.
        User.objects.filter(username__in=usernames).update(password=hashed, role=Role.ANNOTATOR, is_active=True)
        users = {u.username: u for u in User.objects.filter(username__in=usernames)}
        return [users[name] for name in usernames]

    def credentials(self, annotators: list[User], password: str) -> dict[str, Any]:
        session_store = import_module(settings.SESSION_ENGINE).SessionStore
        rows = []
        for user in annotators:
            token, _ = Token.objects.get_or_create(user=user)
            session = session_store()
            session[SESSION_KEY] = user._meta.pk.value_to_string(user)
            session[BACKEND_SESSION_KEY] = AUTH_BACKEND
            session[HASH_SESSION_KEY] = user.get_session_auth_hash()
            session.create()
            rows.append(
                {"username": user.username, "user_id": user.pk, "token": token.key, "session_key": session.session_key}
            )
        return {
            "database": settings.DATABASES["default"]["NAME"],
            "password": password,
            "session_cookie_name": settings.SESSION_COOKIE_NAME,
            "annotators": rows,
            "counts": {
                "tasks": Task.objects.count(),
                "pending tasks": Task.objects.filter(status=Task.Status.PENDING).count(),
                "trajectories": Trajectory.objects.count(),
                "steps": Step.objects.count(),
                "assignments": Assignment.objects.count(),
                "annotators": len(rows),
            },
        }

    # --- tasks -----------------------------------------------------------------------------------------------------

    def seed_tasks(self, wanted: int) -> None:
        have = Task.objects.count()
        if have >= wanted:
            self.stdout.write(f"Tasks: {have} already (>= {wanted}); not adding any.")
            return
        start = Task.objects.filter(external_id__startswith=EXTERNAL_ID_PREFIX).count()
        missing = wanted - have
        with tqdm(total=missing, desc="tasks", unit="task") as bar:
            for offset in range(0, missing, self.batch_size):
                size = min(self.batch_size, missing - offset)
                batch = [self.make_task(start + offset + i) for i in range(size)]
                with transaction.atomic():
                    Task.objects.bulk_create(batch, batch_size=self.batch_size, ignore_conflicts=True)
                bar.update(size)

    def make_task(self, n: int) -> Task:
        rng = self.rng
        domain, platform = rng.choice(DOMAINS)
        desktop = platform == Task.Platform.DESKTOP
        return Task(
            external_id=f"{EXTERNAL_ID_PREFIX}{n:07d}",
            instruction=f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(TAILS)} (bench task {n})",
            platform=platform,
            domain=domain,
            related_apps=[domain],
            difficulty=rng.randint(1, 5),
            importance=rng.randint(0, 100),
            setup_config=[{"type": "launch", "parameters": {"command": [domain]}}] if desktop else [],
            evaluator={"func": "exact_match", "result": {"type": "vm_file"}, "expected": {"type": "rule"}}
            if desktop
            else {},
            metadata={"source": "seed_bench"},
            status=weighted(rng, TASK_STATUS_WEIGHTS),
        )

    # --- trajectories and steps ------------------------------------------------------------------------------------

    def seed_trajectories(self, wanted: int, annotators: list[User]) -> None:
        have = Trajectory.objects.count()
        if have >= wanted:
            self.stdout.write(f"Trajectories: {have} already (>= {wanted}); not adding any.")
            return
        task_ids = list(Task.objects.exclude(status=Task.Status.ARCHIVED).values_list("id", flat=True))
        if not task_ids:
            self.stdout.write(self.style.WARNING("No tasks: no trajectories added."))
            return
        model, _ = ModelVersion.objects.get_or_create(
            name="bench-model", defaults={"checkpoint_uri": "file:///dev/null", "notes": "Made by seed_bench."}
        )
        missing = wanted - have
        batch_size = max(1, self.batch_size // 4)  # each trajectory brings 2-5 steps
        now = timezone.now()
        with tqdm(total=missing, desc="trajectories", unit="traj") as bar:
            for offset in range(0, missing, batch_size):
                size = min(batch_size, missing - offset)
                trajectories = [self.make_trajectory(task_ids, annotators, model, now) for _ in range(size)]
                with transaction.atomic():
                    Trajectory.objects.bulk_create(trajectories)
                    steps = [step for t in trajectories for step in self.make_steps(t)]
                    Step.objects.bulk_create(steps, batch_size=self.batch_size)
                    done = [
                        t
                        for t in trajectories
                        if t.annotator_id is not None and t.status != Trajectory.Status.IN_PROGRESS
                    ]
                    Assignment.objects.bulk_create(
                        [
                            Assignment(
                                task_id=t.task_id,
                                annotator_id=t.annotator_id,
                                status=Assignment.Status.COMPLETED,
                                finished_at=t.submitted_at,
                            )
                            for t in done
                        ]
                    )
                    Task.objects.filter(pk__in=[t.task_id for t in done], status=Task.Status.PENDING).update(
                        status=Task.Status.COMPLETED
                    )
                bar.update(size)

    def make_trajectory(self, task_ids: list[int], annotators: list[User], model: ModelVersion, now: Any) -> Trajectory:
        rng = self.rng
        mode = weighted(rng, MODE_WEIGHTS)
        status = weighted(rng, TRAJECTORY_STATUS_WEIGHTS)
        annotated = mode != Trajectory.Mode.ROLLOUT
        submitted = status != Trajectory.Status.IN_PROGRESS
        return Trajectory(
            task_id=rng.choice(task_ids),
            annotator=rng.choice(annotators) if annotated and annotators else None,
            mode=mode,
            status=status,
            model_version=model if mode != Trajectory.Mode.IN_SITU else None,
            outcome_reward=round(rng.random(), 3) if submitted and not annotated else None,
            metadata={"source": "seed_bench"},
            submitted_at=now - timedelta(minutes=rng.randint(1, 60 * 24 * 30)) if submitted else None,
        )

    def make_steps(self, trajectory: Trajectory) -> list[Step]:
        rng = self.rng
        steps = []
        for index in range(rng.randint(2, 5)):
            template, kind = rng.choice(ACTIONS)
            x, y = rng.randint(0, 1919), rng.randint(0, 1079)  # screen pixels of the default 1920x1080 screen
            action_text = template.format(x=x, y=y)
            by_model = trajectory.mode == Trajectory.Mode.ROLLOUT or (
                trajectory.mode == Trajectory.Mode.INTERACTIVE and rng.random() < 0.6
            )
            steps.append(
                Step(
                    trajectory=trajectory,
                    index=index,
                    thought=f"Step {index}: the target is visible; {kind} it to make progress.",
                    action_text=action_text,
                    action=typed_action(action_text),
                    source=Step.Source.MODEL if by_model else Step.Source.HUMAN,
                    candidates=[
                        candidate(thought="Alternative.", action_text=f"click(start_box='({1919 - x},{1079 - y})')")
                    ]
                    if trajectory.mode == Trajectory.Mode.INTERACTIVE
                    else [],
                    model_latency_ms=rng.randint(200, 3000) if by_model else None,
                )
            )
        return steps

    # --- queue state -----------------------------------------------------------------------------------------------

    @transaction.atomic
    def reset_queue(self, annotators: list[User]) -> None:
        """Undo what a load run did to the queue, so that every run starts from the same state."""
        open_assignments = Assignment.objects.filter(
            annotator__in=annotators,
            status__in=[Assignment.Status.ACTIVE, Assignment.Status.SKIPPED, Assignment.Status.EXPIRED],
        )
        held = list(open_assignments.filter(status=Assignment.Status.ACTIVE).values_list("task_id", flat=True))
        deleted, _ = open_assignments.delete()
        Task.objects.filter(pk__in=held, status=Task.Status.ASSIGNED).update(status=Task.Status.PENDING)
        self.stdout.write(f"Queue reset: {deleted} open assignment(s) dropped, {len(held)} task(s) back in the pool.")
