"""`manage.py flywheel run|resume|requeue-stalled|demo …`: start an iteration from the shell and run it here (every
stage in this process, training included) or queue it for the workers; resume one; queue again iterations whose worker
died; run the demonstration on the bundled task suite (flywheel/demo.py)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from flywheel.iterations import IterationError, reopen_iteration, requeue_stalled, run_iteration, start_iteration
from flywheel.models import AVAILABLE_STAGES, Iteration, ModelVersion


class Command(BaseCommand):
    help = (
        "Flywheel iterations: `run` starts one and runs it in this process or queues it; `resume` runs the rest of one;"
        " `requeue-stalled` queues again those whose worker died."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        run = sub.add_parser("run", help="start an iteration")
        run.add_argument("--base-model", help="registry name of the base model")
        run.add_argument("--scope", choices=Iteration.Scope.values, default=Iteration.Scope.NEW)
        run.add_argument("--mode", action="append", default=[], help="trajectory mode in scope (repeatable)")
        run.add_argument("--domain", action="append", default=[], help="task domain in scope (repeatable)")
        run.add_argument("--from", dest="date_from", help="ISO date-time: submitted at or after")
        run.add_argument("--to", dest="date_to", help="ISO date-time: submitted before")
        run.add_argument(
            "--stage", action="append", default=[], help=f"stage to run (repeatable; available: {AVAILABLE_STAGES})"
        )
        run.add_argument(
            "--config",
            default="{}",
            help='JSON: {"v": {...}, "export": {...}, "train": {"preset": "tiny-cpu", "sft": {...}}, "evaluate": {...},'
            ' "promote": "auto"}',
        )
        run.add_argument("--queue", action="store_true", help="queue it for a Celery worker instead of running here")
        resume = sub.add_parser(
            "resume", help="run the remaining stages of an iteration here (a failed or cancelled one is reopened)"
        )
        resume.add_argument("iteration", type=int)
        resume.add_argument("--queue", action="store_true", help="queue it for the workers instead of running here")
        stalled = sub.add_parser("requeue-stalled", help="queue again running iterations whose worker stopped beating")
        stalled.add_argument("--stall", type=float, default=None, help="seconds without a heartbeat (FLYWHEEL_STALL_S)")
        demo = sub.add_parser("demo", help="the flywheel demonstration on the bundled task suite (docs/flywheel.md)")
        demo.add_argument("--quick", action="store_true", help="two families, fewer instances (about 10 minutes)")
        demo.add_argument("--seed", type=int, default=0, help="seed of the plan (same seed, same numbers within noise)")
        demo.add_argument("--families", default="", help="comma-separated suite families (default: the plan's)")
        demo.add_argument(
            "--iterations", type=int, default=None, help="iterations after the bootstrap (0-10; 2 with --quick, else 3)"
        )
        demo.add_argument(
            "--drills",
            type=int,
            default=None,
            help="pre-train the untrained agent on this many "
            "grounding drills first (default 32000, about 7 minutes; 0 with --quick; docs/agent.md)",
        )
        demo.add_argument(
            "--bootstrap",
            type=int,
            default=None,
            help="oracle demonstrations per family in the bootstrap SFT store (default 2; 4 with --quick)",
        )
        demo.add_argument(
            "--levels",
            default="",
            help="comma-separated difficulty levels (default 2, 1 with --quick); the plan's instances per family are "
            "shared among them",
        )
        demo.add_argument(
            "--rft-temperature",
            type=float,
            default=None,
            help="sampling temperature of RFT's attempts (0-2; default 0.5, 1 with --quick)",
        )
        demo.add_argument(
            "--annotate",
            type=int,
            default=None,
            help="instances of each family the simulated annotators do live each iteration (default 8, 2 with --quick)",
        )
        demo.add_argument(
            "--rft-tasks",
            type=int,
            default=None,
            help="instances of each family RFT samples every iteration (default 5, 2 with --quick)",
        )
        demo.add_argument("--base-url", default="", help="the web app the simulated annotators use (default: WEB_PORT)")
        demo.add_argument("--out", default="", help="folder for report.json and report.png (default: var/demo/<run>)")
        demo.add_argument("--wait", type=float, default=0, help="seconds to wait for the stack to come up")
        default = sub.add_parser(
            "default-agent", help="serve var/models/suite-agent (trained by a short demonstration on the first run)"
        )
        default.add_argument("--retrain", action="store_true", help="run that demonstration again first")
        default.add_argument("--wait", type=float, default=300, help="seconds to wait for the stack to come up")
        default.add_argument("--base-url", default="", help="the web app the simulated annotators use")
        default.add_argument("--out", default="", help="folder for the demonstration's report")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] in ("demo", "default-agent"):
            from flywheel.demo import DemoError, run_default_agent_command, run_demo_command, sigterm_interrupts

            command = run_demo_command if options["action"] == "demo" else run_default_agent_command
            try:
                with sigterm_interrupts():
                    command(self.stdout, options)
            except DemoError as exc:  # a message for the log, not a traceback
                raise CommandError(str(exc)) from None
            except KeyboardInterrupt:
                stopped = "stopped (Ctrl-C or SIGTERM); the iteration it was following, if any, is cancelled"
                raise CommandError(stopped, returncode=130) from None
            return
        if options["action"] == "requeue-stalled":
            found = requeue_stalled(options["stall"] or settings.FLYWHEEL_STALL_S)
            self.stdout.write(f"queued again: {', '.join(map(str, found)) or 'none'}")
            return
        if options["action"] == "resume":
            iteration = Iteration.objects.filter(pk=options["iteration"]).first()
            if iteration is None:
                raise CommandError(f"no iteration {options['iteration']}")
            if iteration.status in (Iteration.Status.FAILED, Iteration.Status.CANCELLED):
                reopen_iteration(iteration)
            if options["queue"]:
                from celery import current_app

                from flywheel.iterations import RUN_TASK

                current_app.send_task(RUN_TASK, args=[iteration.pk])
                self.stdout.write(f"iteration {iteration.pk} queued on the flywheel queue")
                return
            self._report(run_iteration(iteration.pk, remote=False))
            return
        try:
            config = json.loads(options["config"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config is not JSON: {exc.msg}") from None
        base = None
        if options["base_model"]:
            base = ModelVersion.objects.filter(name=options["base_model"]).first()
            if base is None:
                raise CommandError(f"no model named {options['base_model']!r} in the registry")
        dates = {}
        for key in ("date_from", "date_to"):
            if options[key]:
                dates[key] = parse_datetime(options[key])
                if dates[key] is None:
                    raise CommandError(f"--{key[5:]} is not an ISO date-time: {options[key]!r}")
        try:
            iteration = start_iteration(
                None,
                base_model=base,
                scope=options["scope"],
                modes=options["mode"],
                domains=options["domain"],
                stages=options["stage"] or None,
                config=config,
                enqueue=options["queue"],
                **dates,
            )
        except IterationError as exc:
            raise CommandError(str(exc)) from None
        if options["queue"]:
            self.stdout.write(f"iteration {iteration.pk} queued on the flywheel queue")
            return
        self._report(run_iteration(iteration.pk, remote=False))

    def _report(self, iteration: Iteration) -> None:
        self.stdout.write(f"iteration {iteration.pk}: {iteration.status}")
        for name, entry in iteration.stages.items():
            self.stdout.write(f"  {name}: {entry.get('status')} {json.dumps(entry.get('output'), default=str)}")
        if iteration.status == Iteration.Status.FAILED:
            raise CommandError(iteration.error)
