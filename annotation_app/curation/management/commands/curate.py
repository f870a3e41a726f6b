"""`manage.py curate dedup [--all] [--resign]` groups near-duplicate trajectories; `manage.py curate verify ID…`
replays trajectories in the sandbox here, in this process (the page queues them on the sandbox queue instead)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from annotation_app.curation.dedup import dedup_pending, dedup_store
from annotation_app.curation.verify import Refused, run_verification, start_verification


class Command(BaseCommand):
    help = "Curation: near-duplicate grouping over the store, executability replays of trajectories."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        dedup = sub.add_parser("dedup", help="sign and group trajectories (only unsigned ones without --all)")
        dedup.add_argument("--all", action="store_true", help="the whole store: also re-sign changed trajectories")
        dedup.add_argument("--resign", action="store_true", help="with --all: recompute every signature")
        dedup.add_argument("--limit", type=int, default=100_000, help="at most this many unsigned ones")
        verify = sub.add_parser("verify", help="replay trajectories now, in this process")
        verify.add_argument("ids", nargs="+", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "dedup":
            if options["all"]:
                counts = dedup_store(resign=options["resign"])
            else:
                counts = dedup_pending(options["limit"])
            self.stdout.write(f"checked {counts['checked']}, in a duplicate group {counts['grouped']}")
            return
        try:
            runs, problems = start_verification(options["ids"], enqueue=False)
        except Refused as exc:
            raise CommandError(str(exc)) from exc
        for problem in problems:
            self.stderr.write(problem)
        for run in runs:
            done = run_verification(run.pk)
            line = f"trajectory {done.trajectory_id}: {done.status}, divergent steps {done.divergent_steps or 'none'}"
            self.stdout.write(f"{line}, evaluator {done.evaluator_score}; {'; '.join(done.errors) or 'no errors'}")
