"""Load demo users, tasks, a model and a few trajectories so every role's page has something to show. Idempotent."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from annotation_app.candidates import candidate
from annotation_app.models import Role, Step, Task, Trajectory, User
from annotation_app.task_queue import next_task
from annotation_app.trajectories import typed_action
from flywheel.models import ModelVersion

DEMO_PASSWORD = "demo-pass-123"
DEMO_USERS = [
    ("annotator", Role.ANNOTATOR, False),
    ("annotator2", Role.ANNOTATOR, False),
    ("lead", Role.DATA_LEAD, False),
    ("engineer", Role.ML_ENGINEER, False),
    ("admin", Role.DATA_LEAD, True),
]
DEMO_TASKS = [
    ("chrome", "browser", 2, "Open the website 'example.org' in a new tab and bookmark it."),
    ("chrome", "browser", 3, "Change the default search engine of the browser to DuckDuckGo."),
    ("libreoffice_calc", "desktop", 3, "Sum column B of the open spreadsheet and put the total in B20."),
    ("libreoffice_calc", "desktop", 4, "Create a bar chart of monthly sales from the table on Sheet1."),
    ("libreoffice_writer", "desktop", 2, "Make the document title bold and centre it."),
    ("gimp", "desktop", 4, "Resize the open image to 800 pixels wide, keeping its aspect ratio, and export it as PNG."),
    (
        "terminal",
        "desktop",
        2,
        "Create a folder named 'reports' in the home directory and move every .csv file into it.",
    ),
    ("vs_code", "desktop", 3, "Install the Python extension and set the editor font size to 16."),
    (
        "thunderbird",
        "desktop",
        3,
        "Create a mail filter that moves messages from 'billing@example.com' to the Invoices folder.",
    ),
    ("os", "desktop", 1, "Turn on the 'Do Not Disturb' mode."),
    ("2048", "game", 3, "Play 2048 until you reach the 512 tile."),
    ("settings", "mobile", 2, "Enable dark mode in the phone's display settings."),
]


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
        for i, (domain, platform, difficulty, instruction) in enumerate(DEMO_TASKS):
            Task.objects.get_or_create(
                external_id=f"demo-{i:03d}",
                defaults={
                    "instruction": instruction,
                    "domain": domain,
                    "platform": platform,
                    "difficulty": difficulty,
                    "importance": len(DEMO_TASKS) - i,
                    "related_apps": [domain],
                    "created_by": users["lead"],
                    "setup_config": [{"type": "launch", "parameters": {"command": [domain]}}]
                    if platform == "desktop"
                    else [],
                },
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
            assignment = next_task(users["annotator2"])
            trajectory = Trajectory.objects.create(
                task=assignment.task,
                annotator=users["annotator2"],
                mode=Trajectory.Mode.INTERACTIVE,
                model_version=model,
                status=Trajectory.Status.SUBMITTED,
            )
            Step.objects.create(
                trajectory=trajectory,
                index=0,
                source=Step.Source.MODEL,
                thought="The browser is open; I need the address bar first.",
                action_text="hotkey(key='ctrl t')",
                action=typed_action("hotkey(key='ctrl t')"),
            )
            Step.objects.create(
                trajectory=trajectory,
                index=1,
                source=Step.Source.HUMAN,
                thought="Type the address and press Enter to load the site.",
                action_text="type(content='example.org\\n')",
                action=typed_action("type(content='example.org\\n')"),
                candidates=[candidate(thought="Click the address bar.", action_text="click(start_box='(640,60)')")],
            )
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
