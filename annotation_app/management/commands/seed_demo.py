"""Load demo users, tasks, a model and a few trajectories so every role's page has something to show. Idempotent."""

from __future__ import annotations

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from annotation_app.candidates import candidate
from annotation_app.models import Role, Step, Task, Trajectory, User
from annotation_app.task_queue import next_task
from annotation_app.trajectories import submit, typed_action
from flywheel.demo_families import DEFAULT_AGENT_FAMILIES
from flywheel.models import ModelVersion

DEMO_PASSWORD = "demo-pass-123"
DEMO_USERS = [
    ("annotator", Role.ANNOTATOR, False),
    ("annotator2", Role.ANNOTATOR, False),
    ("lead", Role.DATA_LEAD, False),
    ("engineer", Role.ML_ENGINEER, False),
    ("admin", Role.DATA_LEAD, True),
]


def _terminal(script: str = "") -> list[dict]:
    """Setup: optional shell commands in the session's home, then a terminal on the desktop."""
    steps = [{"type": "execute", "parameters": {"command": script, "shell": True}}] if script else []
    return [*steps, {"type": "launch", "parameters": {"command": ["xterm", "-maximized"]}}]


def _output_is(command: str, expected: str) -> dict:
    """Evaluator: `command`'s output, run in the session after the annotator finished, equals `expected`."""
    return {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": command, "shell": True},
        "expected": {"type": "rule", "rules": {"expected": expected}},
    }


# Tasks the sandbox desktop can really run (xterm, mousepad), each with an OSWorld evaluator, plus one infeasible
# task (the right answer is fail()) and one without an evaluator.
# (external id, domain, difficulty, instruction, setup, evaluator)
TODO_FILE = {"type": "execute", "parameters": {"command": "printf 'call mum\\n' > ~/todo.txt", "shell": True}}
DEMO_TASKS: list[tuple[str, str, int, str, list[dict], dict]] = [
    (
        "demo2-date", "terminal", 1, "Write today's date into a file named date.txt in your home folder.",
        _terminal(), _output_is("test -s ~/date.txt && echo written", "written"),
    ),
    (
        "demo2-notes", "mousepad", 2,
        "Type 'hello world' in the text editor and save it as notes.txt in your home folder.",
        [{"type": "launch", "parameters": {"command": ["mousepad"]}}], _output_is("cat ~/notes.txt", "hello world"),
    ),
    (
        "demo2-todo", "mousepad", 2, "Add a line 'buy milk' at the end of todo.txt and save the file.",
        [TODO_FILE, {"type": "launch", "parameters": {"command": ["mousepad", "todo.txt"]}}],
        _output_is("tail -n 1 ~/todo.txt", "buy milk"),
    ),
    (
        "demo2-reports", "terminal", 3,
        "Create a folder named reports in your home folder and move every .csv file into it.",
        _terminal("touch jan.csv feb.csv notes.txt"),
        _output_is("cd ~ && ls reports/*.csv | wc -l && ls *.csv 2>/dev/null | wc -l", "2\n0"),
    ),
    (
        "demo2-lines", "terminal", 3,
        "Count the lines of /etc/passwd and write the number into lines.txt in your home folder.",
        _terminal(), _output_is('[ "$(cat ~/lines.txt)" = "$(wc -l < /etc/passwd)" ] && echo right', "right"),
    ),
    (
        "demo2-script", "terminal", 4,
        "Write a shell script hello.sh in your home folder that prints 'hi', and make it executable.",
        _terminal(), _output_is("cd ~ && ./hello.sh", "hi"),
    ),
    (
        "demo2-spreadsheet", "office", 3, "Sum column B of the open spreadsheet and put the total in B20.",
        _terminal(), {"func": "infeasible"},  # no spreadsheet app here: the right answer is fail()
    ),
    (
        "demo2-explore", "terminal", 1, "Open the terminal and list the files in your home folder, hidden ones too.",
        _terminal(), {},  # no evaluator: the trajectory says so instead of a score
    ),
]  # fmt: skip


class Command(BaseCommand):
    help = __doc__

    @transaction.atomic
    def handle(self, *args: object, **options: object) -> None:
        if settings.ENVIRONMENT == "production":  # its users, the superuser among them, share a published password
            raise CommandError(
                "seed_demo creates users with the public demo password: refused with DJANGO_ENV=production."
            )
        users = {}
        for username, role, is_admin in DEMO_USERS:
            user, created = User.objects.get_or_create(
                username=username, defaults={"role": role, "is_staff": is_admin, "is_superuser": is_admin}
            )
            if created:
                user.set_password(DEMO_PASSWORD)
                user.save()
            users[username] = user
        for i, (external_id, domain, difficulty, instruction, setup, evaluator) in enumerate(DEMO_TASKS):
            Task.objects.get_or_create(
                external_id=external_id,
                defaults={
                    "instruction": instruction,
                    "domain": domain,
                    "platform": Task.Platform.DESKTOP,
                    "difficulty": difficulty,
                    "importance": len(DEMO_TASKS) - i,
                    "related_apps": [domain],
                    "created_by": users["lead"],
                    "setup_config": setup,
                    "evaluator": evaluator,
                },
            )
        # Earlier versions seeded tasks for apps the sandbox does not have (LibreOffice, GIMP, …): out of the pool.
        Task.objects.filter(external_id__regex=r"^demo-\d{3}$").exclude(status=Task.Status.ARCHIVED).update(
            status=Task.Status.ARCHIVED
        )
        model, _ = ModelVersion.objects.get_or_create(
            name="ui-tars-1.5-7b",
            defaults={"checkpoint_uri": "hf://ByteDance-Seed/UI-TARS-1.5-7B", "notes": "Base model of the flywheel."},
        )
        # The embedded policy server (Procfile `policy`) proposes in live annotation until a real model is promoted.
        embedded, _ = ModelVersion.objects.get_or_create(
            name="tiny-uitars-embedded",
            defaults={
                "checkpoint_uri": "var/models/tiny-uitars",
                "endpoint_url": settings.EMBEDDED_POLICY_URL,
                "served_name": "tiny-uitars",
                "notes": "Random tiny Qwen2.5-VL built from a config; grammar-constrained, so every proposal parses.",
            },
        )
        active = ModelVersion.objects.filter(is_active=True).first()
        if active is None or not active.endpoint_url:
            embedded.promote()
        if not Trajectory.objects.filter(annotator=users["annotator2"]).exists():
            # A submitted interactive trajectory for the lead to review; submit() completes annotator2's assignment.
            assignment = next_task(users["annotator2"])
            trajectory = Trajectory.objects.create(
                task=assignment.task,
                annotator=users["annotator2"],
                mode=Trajectory.Mode.INTERACTIVE,
                model_version=model,
                screen_width=1280,
                screen_height=800,
            )
            Step.objects.create(
                trajectory=trajectory,
                index=0,
                source=Step.Source.MODEL,
                thought="The terminal is open; I will write the date into the file with one command.",
                action_text="type(content='date > date.txt\\n')",
                action=typed_action("type(content='date > date.txt\\n')"),
                candidates=[
                    candidate(thought="Click the terminal first.", action_text="click(start_box='(640,400)')"),
                    candidate(
                        thought="The terminal is open; I will write the date into the file with one command.",
                        action_text="type(content='date > date.txt\\n')",
                    ),
                ],
                chosen_candidate=1,
            )
            Step.objects.create(
                trajectory=trajectory,
                index=1,
                source=Step.Source.HUMAN,
                thought="The file is written; the task is done.",
                action_text="finished(content='date.txt holds the date')",
                action=typed_action("finished(content='date.txt holds the date')"),
            )
            submit(trajectory)
        # The bundled verifiable task suite (sandbox/suite, docs/task-suite.md): two training instances and one
        # held-out instance of every family at level 1, so RFT, PPO and evaluation have tasks in the demo.
        call_command("suite_tasks", "--import", "--train", "2", "--heldout", "1", "--levels", "1", verbosity=0)
        first_for_newcomers()
        self.stdout.write(self.style.SUCCESS("Demo data ready."))


def first_for_newcomers() -> int:
    """Put the suite's training instances of the browser families that scripts/run's default agent learns
    (`flywheel.demo.DEFAULT_PLAN`) first in the queue, so a newcomer's first live session is a task where its
    proposals make sense; it has never seen the desktop tasks above. A demonstration's own tasks (`…@<run>`) and
    tasks a data lead gave another importance keep their place (this runs on every scripts/run start)."""
    return (
        Task.objects.filter(metadata__suite__in=DEFAULT_AGENT_FAMILIES, metadata__split="train")
        .filter(status=Task.Status.PENDING, importance=0)
        .exclude(external_id__contains="@")
        .update(importance=len(DEMO_TASKS) + 1)
    )
