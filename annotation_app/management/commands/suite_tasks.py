"""Write the bundled task suite's instances as a JSON Lines task file, or import them into the task pool.

Examples: `manage.py suite_tasks --out var/suite.jsonl` (every family, 20 training and 5 held-out seeds per level),
`manage.py suite_tasks --import --families click-button,slider --train 5 --heldout 2 --levels 1`."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from annotation_app.task_import import TaskImportError, import_tasks
from sandbox.suite import families, suite_tasks

MAX_SEEDS = 10_000


def parse_names(text: str) -> list[str]:
    """Family names from a comma-separated list ("all" for every family); unknown names are an error naming them."""
    names = families() if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in families()]
    if unknown or not names:
        raise CommandError(f"unknown famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown) or '(none given)'}; "
                           f"known: {', '.join(families())}")  # fmt: skip
    return names


def parse_levels(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise CommandError(f"--levels takes comma-separated integers, got {text!r}") from None


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--families", default="all", help="Comma-separated family names, or 'all'.")
        parser.add_argument("--train", type=int, default=20, help="Training seeds per family and level.")
        parser.add_argument("--heldout", type=int, default=5, help="Held-out seeds per family and level.")
        parser.add_argument("--levels", default="", help="Difficulty levels to include, e.g. '1,2' (default: all).")
        parser.add_argument("--out", type=Path, help="Write the tasks to this JSON Lines file.")
        parser.add_argument(
            "--import", dest="do_import", action="store_true", help="Import into the task pool (existing ids skipped)."
        )

    def handle(
        self, *args: object, families: str, train: int, heldout: int, levels: str, out: Path | None,
        do_import: bool, **options: object,
    ) -> None:  # fmt: skip
        if not out and not do_import:
            raise CommandError("say what to do: --out FILE, --import, or both")
        for flag, count in (("--train", train), ("--heldout", heldout)):
            if not 0 <= count <= MAX_SEEDS:
                raise CommandError(f"{flag} must be between 0 and {MAX_SEEDS}, got {count}")
        tasks = suite_tasks(parse_names(families), train, heldout, parse_levels(levels))
        data = "".join(json.dumps(task) + "\n" for task in tasks).encode()
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            self.stdout.write(f"{out}: {len(tasks)} tasks")
        if do_import:
            try:
                result = import_tasks(data, "suite.jsonl", on_conflict="skip")
            except TaskImportError as exc:  # a bug in a family: its tasks don't pass the importer's checks
                raise CommandError(f"nothing imported: {exc}") from None
            self.stdout.write(f"suite: {result.created} created, {result.skipped} skipped")
