"""Import tasks from JSON / JSON Lines files (OSWorld task files included), all or nothing, with a progress bar."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from annotation_app.task_import import TaskImportError, import_tasks, parse_records


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path)
        parser.add_argument("--skip-existing", action="store_true", help="Leave out ids already in the database.")

    def handle(self, *args: object, paths: list[Path], skip_existing: bool, **options: object) -> None:
        for path in paths:
            if not path.is_file():
                raise CommandError(f"{path}: no such file")
            data = path.read_bytes()
            try:
                total = len(parse_records(data, path.name))
                with tqdm(total=total, desc=path.name, unit="task", disable=None) as bar:
                    result = import_tasks(
                        data, path.name, on_conflict="skip" if skip_existing else "error", progress=bar.update
                    )
            except TaskImportError as exc:
                lines = "\n".join(f"  {e}" for e in exc.errors)
                raise CommandError(f"{path}: nothing imported, {exc.total_errors} problem(s):\n{lines}") from None
            self.stdout.write(f"{path}: {result.created} created, {result.skipped} skipped")
