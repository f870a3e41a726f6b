"""The flywheel's training and evaluation stages: the bundled trainer's CLI (`python -m training ct|sft|value|ppo|eval`)
as a child process of the `train` worker, its progress read from the run's metrics.jsonl and log, its result
registered in the model registry.

Model chain: base_model.checkpoint_uri → CT → SFT → PPO (value pretraining, when selected, fits PPO's critic), each
stage's `final/` the next one's input. Run directories: FLYWHEEL_RUNS_ROOT/iteration-<id>/<stage>/ (`trainer/` is the
trainer's --out, `log.txt` its output, attempts appended). A rerun after a killed worker stops the orphaned trainer
(same host), then continues from the trainer's latest checkpoint (--resume) or starts over in a clean directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import typing
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from annotation_app.models import Task

from . import subprocesses
from .models import DatasetVersion, Iteration, ModelVersion, Stage
from .progress import Cancelled, IterationError, progress

TRAINING = (Stage.CT, Stage.SFT, Stage.VALUE, Stage.PPO)
MODEL_CHAIN = (Stage.CT, Stage.SFT, Stage.PPO)  # VALUE makes PPO's critic, not a policy
MANAGED = {"model", "data", "out", "resume", "mode", "tasks", "sandbox_url", "sandbox_api_key", "critic", "progress"}
METRIC_ROWS = 500
LOG_LINES = 50
TICK_S = 0.5
HEARTBEAT_S = 5.0

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # Minutes on a CPU with the tiny model: for tests and trying the loop end to end.
    "tiny-cpu": {
        "ct": {"batch_episodes": 2, "micro_batch": 1, "max_steps": 3, "lr": 1e-4, "save_every": 1, "keep": 1},
        "sft": {"batch_episodes": 2, "micro_batch": 1, "max_steps": 3, "lr": 1e-4, "save_every": 1, "keep": 1},
        "value": {
            "episodes_per_step": 2,
            "value_max_steps": 1,
            "max_turns": 2,
            "max_new_tokens": 24,
            "concurrency": 2,
            "save_every": 1,
            "keep": 1,
        },
        "ppo": {
            "episodes_per_step": 2,
            "iterations": 2,
            "max_turns": 2,
            "max_new_tokens": 24,
            "concurrency": 2,
            "save_every": 1,
            "keep": 1,
        },
    },
    # The suite agent (training/agent.py, docs/agent.md) on a 2-core CPU: a from-scratch model needs a high learning
    # rate and several passes over a few hundred oracle demonstrations; PPO is short, on browser suite tasks. Its
    # tokenizer is byte-level: a click naming a long outline line is up to ~180 tokens, hence 200 new tokens. The
    # store's layout follows trajectory ids (when concurrent annotators and RFT attempts started): shuffling by content
    # makes the same data train the same model.
    "suite-cpu": {
        "ct": {
            "batch_episodes": 8,
            "micro_batch": 8,
            "epochs": 1,
            "lr": 1e-3,
            "max_length": 4096,
            "save_every": 50,
            "shuffle": True,
        },
        "sft": {
            "batch_episodes": 8,
            "shuffle": True,
            "micro_batch": 8,
            "epochs": 6,
            "lr": 3e-3,
            "warmup_steps": 5,
            "max_length": 4096,
            "save_every": 50,
            "keep": 1,
        },
        "value": {
            "episodes_per_step": 8,
            "value_max_steps": 3,
            "max_turns": 6,
            "max_new_tokens": 200,
            "concurrency": 2,
            "critic_lr": 1e-3,
            "save_every": 5,
            "keep": 1,
        },
        "ppo": {
            "episodes_per_step": 8,
            "iterations": 3,
            "max_turns": 6,
            "max_new_tokens": 200,
            "temperature": 1.0,
            "concurrency": 2,
            "actor_lr": 1e-4,
            "critic_lr": 1e-3,
            "advantage": "grpo",
            "group_size": 4,
            "max_length": 8192,
            "save_every": 1,
            "keep": 1,
        },
    },
    # The trainer's own defaults (the report's values), checkpointing often enough to resume after a crash.
    "default": {
        "ct": {"save_every": 50},
        "sft": {"save_every": 50},
        "value": {"save_every": 10},
        "ppo": {"save_every": 10},
    },
}
EVALUATE_DEFAULTS = {
    "tiny-cpu": {"episodes": 2, "max_new_tokens": 24},
    "suite-cpu": {"episodes": 30, "max_new_tokens": 200},
    "default": {"episodes": 32},
}
EVALUATE_KEYS = {
    "episodes": int, "max_new_tokens": int, "temperature": float, "seed": int, "task_ids": list, "env": str,
}  # fmt: skip
TASK_KEYS = {"ids", "domains"}


# --- configuration ----------------------------------------------------------------------------------------------------


def _fields(stage: str) -> dict[str, type]:
    """The trainer's options for a stage: its config dataclass's fields and their types (imported when first asked)."""
    if stage in (Stage.CT, Stage.SFT):
        from training.sft import SFTConfig as cls
    else:
        from training.ppo import PPOConfig as cls
    found: dict[str, type] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):  # nested settings: the CLI's --lora-r, --shaping-format-penalty
            inner = typing.get_type_hints(kind)
            found.update({f"{f.name}_{g.name}": inner[g.name] for g in dataclasses.fields(kind)})
        else:
            found[f.name] = kind
    return found


def _check_value(where: str, value: Any, kind: type) -> None:
    ok = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ValueError(f"{where} must be {kind.__name__}, not {type(value).__name__}")


def check_train_config(raw: dict[str, Any] | None) -> dict[str, Any]:
    """config["train"] with defaults: {"preset", "nproc", "ct"|"sft"|"value"|"ppo": {trainer option: value},
    "tasks": {"ids", "domains"}}; ValueError says what is wrong."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - {"preset", "nproc", "tasks", "start_from", "store_since", *TRAINING})
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} "
            "(known: preset, nproc, tasks, start_from, store_since, ct, sft, value, ppo)"
        )
    preset = raw.get("preset", "default")
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}")
    nproc = raw.get("nproc", 1)
    if not isinstance(nproc, int) or isinstance(nproc, bool) or not 1 <= nproc <= 64:
        raise ValueError("nproc must be a whole number from 1 to 64 (processes per training run; >1 uses torchrun)")
    out: dict[str, Any] = {"preset": preset, "nproc": nproc, "tasks": _check_tasks(raw.get("tasks"), "tasks")}
    start = raw.get("start_from")
    if start is not None:
        if not isinstance(start, int) or isinstance(start, bool):
            raise ValueError("start_from must be a model id (the checkpoint training starts from instead of the base)")
        if not ModelVersion.objects.filter(pk=start).exclude(checkpoint_uri="").exists():
            raise ValueError(f"start_from: no model {start} with a checkpoint")
        out["start_from"] = start
    since = raw.get("store_since")
    if since is not None:
        parsed = parse_datetime(since) if isinstance(since, str) else None
        if parsed is None or parsed.tzinfo is None:
            raise ValueError("store_since must be a time with its zone (ISO 8601, e.g. 2026-11-23T09:47:31+00:00)")
        out["store_since"] = parsed.isoformat()
    for stage in TRAINING:
        overrides = raw.get(stage) or {}
        if not isinstance(overrides, dict):
            raise ValueError(f"{stage} must be an object of trainer options")
        fields = _fields(stage)
        for name, value in overrides.items():
            if name in MANAGED:
                raise ValueError(f"{stage}.{name} is set by the flywheel (model chain, data, run directory)")
            if name not in fields:
                raise ValueError(f"{stage}.{name} is not an option of `python -m training {stage}`")
            if name == "env" and not str(value).startswith("sandbox"):
                raise ValueError(f"{stage}.env must be a sandbox spec (sandbox or sandbox:max_steps=N)")
            _check_value(f"{stage}.{name}", value, fields[name])
        out[stage] = {**PRESETS[preset].get(stage, {}), **overrides}
        if stage in (Stage.CT, Stage.SFT) and out[stage].get("batch_episodes", nproc) < nproc:
            raise ValueError(f"{stage}.batch_episodes must be at least nproc ({nproc}): every process takes an episode")
    return out


def _check_tasks(raw: Any, where: str) -> dict[str, list[Any]]:
    raw = dict(raw or {})
    if set(raw) - TASK_KEYS:
        raise ValueError(f"{where} takes only ids (task ids) and domains")
    ids, domains = raw.get("ids") or [], raw.get("domains") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{where}.ids must be a list of task ids (numbers)")
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ValueError(f"{where}.domains must be a list of domain names")
    return {"ids": ids, "domains": domains}


def check_evaluate_config(raw: dict[str, Any] | None, preset: str = "default") -> dict[str, Any]:
    """config["evaluate"] with defaults: episodes, max_new_tokens, temperature, seed, task_ids (held-out tasks)."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(EVALUATE_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(EVALUATE_KEYS)})")
    for name, value in raw.items():
        _check_value(name, value, EVALUATE_KEYS[name])
    if "env" in raw and not raw["env"].startswith("sandbox"):
        raise ValueError("env must be a sandbox spec (sandbox or sandbox:max_steps=N)")
    if "episodes" in raw and not 1 <= raw["episodes"] <= 10_000:
        raise ValueError("episodes must be from 1 to 10000")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in raw.get("task_ids", [])):
        raise ValueError("task_ids must be a list of task ids (numbers)")
    return {**EVALUATE_DEFAULTS.get(preset, {}), **raw}


# --- tasks ------------------------------------------------------------------------------------------------------------


def verifiable_tasks(*, heldout: bool, ids: list[int] | None = None, domains: list[str] | None = None) -> list[Task]:
    """Tasks with an evaluator, held out (metadata.split == "heldout") or not, narrowed by ids and domains."""
    queryset = Task.objects.exclude(evaluator={}).exclude(status=Task.Status.ARCHIVED).order_by("id")
    if ids:
        queryset = queryset.filter(pk__in=ids)
    if domains:
        queryset = queryset.filter(domain__in=domains)
    return [t for t in queryset if ((t.metadata or {}).get("split") == "heldout") == heldout]


def ppo_tasks(config: dict[str, Any]) -> list[Task]:
    """The verifiable training tasks PPO and value pretraining play: never a held-out one."""
    narrow = config.get("train", {}).get("tasks", {})
    return verifiable_tasks(heldout=False, ids=narrow.get("ids"), domains=narrow.get("domains"))


def heldout_tasks(config: dict[str, Any]) -> list[Task]:
    """The held-out tasks evaluation plays (config.evaluate.task_ids narrows them)."""
    return verifiable_tasks(heldout=True, ids=config.get("evaluate", {}).get("task_ids"))


def write_task_file(tasks: list[Task], path: Path) -> Path:
    """The trainer's task file: JSONL of OSWorld-format task dicts (id, instruction, config, evaluator)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": t.external_id or f"task-{t.pk}", "instruction": t.instruction, "config": t.setup_config or [],
         "evaluator": t.evaluator, "domain": t.domain, "platform": t.platform}
        for t in tasks
    ]  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return path


# --- the model chain and the data -------------------------------------------------------------------------------------


def runs_root() -> Path:
    return Path(settings.FLYWHEEL_RUNS_ROOT)


def run_dir(iteration: Iteration, stage: str) -> Path:
    return runs_root() / f"iteration-{iteration.pk}" / stage


def trainer_dir(iteration: Iteration, stage: str) -> Path:
    return run_dir(iteration, stage) / "trainer"


def output_of(iteration: Iteration, stage: str) -> Path:
    """Where a training stage leaves its result: the policy in `final/`, value pretraining's critic in `critic/`."""
    return trainer_dir(iteration, stage) / ("critic" if stage == Stage.VALUE else "final")


def base_checkpoint(iteration: Iteration) -> str:
    base = iteration.base_model
    if base is None or not base.checkpoint_uri:
        raise IterationError("training needs a base model with a checkpoint")
    return base.checkpoint_uri


def policy_input(iteration: Iteration, stage: str) -> str:
    """The policy a stage starts from: the previous selected stage of CT → SFT → PPO, else `train.start_from`'s
    checkpoint, else the base model."""
    chain = [s for s in MODEL_CHAIN if s in iteration.selected_stages]
    if stage == Stage.VALUE:  # fits the critic for the policy PPO will start from
        earlier = [s for s in chain if s != Stage.PPO]
    else:
        earlier = chain[: chain.index(stage)] if stage in chain else chain
    if earlier:
        return str(output_of(iteration, earlier[-1]))
    start = (iteration.config.get("train") or {}).get("start_from")
    if start is not None:  # retraining: e.g. the untrained agent on the whole store, not the base's weights
        model = ModelVersion.objects.filter(pk=start).first()
        if model is None or not model.checkpoint_uri:
            raise IterationError(f"train.start_from: model {start} is gone or has no checkpoint")
        return model.checkpoint_uri
    return base_checkpoint(iteration)


def last_of_chain(iteration: Iteration) -> str | None:
    """The stage whose result is the iteration's new model (registered and evaluated)."""
    chain = [s for s in MODEL_CHAIN if s in iteration.selected_stages]
    return chain[-1] if chain else None


def store_version(iteration: Iteration, kind: str) -> DatasetVersion:
    """The store version a CT/SFT stage trains on: the one this iteration exported, else the newest one."""
    made = DatasetVersion.objects.filter(iteration=iteration, kind=kind).first()
    newest = made or DatasetVersion.objects.filter(kind=kind).order_by("-number").first()
    if newest is None:
        raise IterationError(f"no {kind.upper()} store version to train on (nothing was routed to {kind.upper()} yet)")
    return newest


def trained_versions(iteration: Iteration, version: DatasetVersion) -> QuerySet[DatasetVersion]:
    """The store versions a CT/SFT stage trains on through `version`: it and its parents, only those made since
    `train.store_since` when the iteration sets it."""
    versions = DatasetVersion.objects.filter(kind=version.kind, number__lte=version.number)
    since = (iteration.config.get("train") or {}).get("store_since")
    return versions if since is None else versions.filter(created_at__gte=parse_datetime(since))


def data_dir(iteration: Iteration, stage: str, version: DatasetVersion) -> Path:
    """A directory the trainer reads as the version: links to the version's episode files and the store's images (the
    episodes name their images relative to the file); with `train.store_since`, only the files of versions made since
    then (a demonstration trains on its own data, not on what earlier runs left in the store)."""
    from .export import version_files

    since = (iteration.config.get("train") or {}).get("store_since")
    first = None
    if since is not None:
        first = trained_versions(iteration, version).order_by("number").values_list("number", flat=True).first()
        if first is None:
            raise IterationError(f"no {version.kind.upper()} store version was made since {since} to train on")
    files = version_files(version, since_version=first)
    target = run_dir(iteration, stage) / "data"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for file in files:
        (target / file.name).symlink_to(file)
    if files and (files[0].parent / "images").exists():
        (target / "images").symlink_to(files[0].parent / "images")
    return target


# --- running ----------------------------------------------------------------------------------------------------------


def trainer_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1"}
    if settings.SANDBOX_API_KEY:
        env["SANDBOX_API_KEY"] = settings.SANDBOX_API_KEY  # by environment: never on a command line `ps` shows
    return env


def launcher(nproc: int) -> list[str]:
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [sys.executable]


def options(values: dict[str, Any]) -> list[str]:
    """--flag value pairs (booleans as --flag / --no-flag), as the trainer's CLI takes them."""
    out: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def training_command(iteration: Iteration, stage: str, *, resume: bool) -> list[str]:
    """The trainer's command line for a stage of this iteration."""
    train = iteration.config.get("train") or check_train_config(None)
    out = trainer_dir(iteration, stage)
    args: dict[str, Any] = {"model": policy_input(iteration, stage), "out": str(out)}
    if stage in (Stage.CT, Stage.SFT):
        args["data"] = str(data_dir(iteration, stage, store_version(iteration, stage)))
    else:
        tasks = ppo_tasks(iteration.config)
        if not tasks:
            raise IterationError("no verifiable training tasks (tasks with an evaluator, not held out) for PPO")
        args.update(env="sandbox", tasks=str(write_task_file(tasks, run_dir(iteration, stage) / "tasks.jsonl")))
        args["sandbox_url"] = settings.SANDBOX_URL
        if stage == Stage.PPO and Stage.VALUE in iteration.selected_stages:
            args["critic"] = str(output_of(iteration, Stage.VALUE))
    args.update(train.get(stage, {}))
    args.update(progress=False, resume=resume)
    return [*launcher(train.get("nproc", 1)), "-m", "training", stage, *options(args)]


class Watch:
    """Follows a running trainer: new metrics rows (one per step, the latest kept on a resumed step), the log's tail;
    writes them to the stage entry and checks for a cancel."""

    def __init__(self, iteration: Iteration, stage: str, metrics: Path, log: Path, total: int | None = None,
                 plot: bool = True) -> None:  # fmt: skip
        self.iteration, self.stage, self.metrics, self.log = iteration, stage, metrics, log
        self.offset, self.rows, self.total, self.log_size = 0, {}, total, -1
        self.last_write = 0.0
        self.before = 0  # progress counted before this file (the evaluations already played)
        self.plot = plot  # the rows are metrics to chart (a trainer's), not only a count (evaluation's episodes)

    def follow(self, metrics: Path, before: int) -> None:
        """Read `metrics` from its start from now on, its steps counted after `before` done already."""
        self.metrics, self.offset, self.rows, self.before = metrics, 0, {}, before

    def read(self) -> bool:
        """Reads what the trainer wrote since the last call; whether anything changed."""
        changed = False
        try:
            with self.metrics.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            data = b""
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                self.rows[row["step"]] = row
                self.total = self.before + row["total_steps"] if row.get("total_steps") else self.total
                changed = True
        try:
            size = self.log.stat().st_size
        except OSError:
            size = 0
        if size != self.log_size:
            self.log_size, changed = size, True
        return changed

    def tick(self) -> bool:
        """Called while the trainer runs: records progress (at most every TICK_S, a heartbeat at least every
        HEARTBEAT_S); raises Cancelled when a cancel was asked for."""
        now = time.monotonic()
        if self.read() or now - self.last_write >= HEARTBEAT_S:
            self.last_write = now
            self.write()
        return False

    def write(self) -> None:
        entry = self.iteration.stages[self.stage]
        steps = sorted(self.rows)
        if self.plot:
            entry["metrics"] = [self.rows[s] for s in steps[-METRIC_ROWS:]]
        entry["log_tail"] = subprocesses.tail(self.log, LOG_LINES)
        progress(self.iteration, self.stage, self.before + (steps[-1] if steps else 0), self.total)

    def last(self) -> dict[str, Any]:
        return self.rows[max(self.rows)] if self.rows else {}


def _prepare(iteration: Iteration, stage: str, command_dir: Path) -> dict[str, Any]:
    """Before (re)running: stop a trainer an earlier attempt left running on this host."""
    entry = iteration.stages[stage]
    if entry.get("pgid") and subprocesses.stop_orphan(entry.get("host"), str(command_dir) + os.sep):
        entry["orphan_stopped"] = entry.get("orphan_stopped", 0) + 1
    entry["attempts"] = entry.get("attempts", 0) + 1
    return entry


def run_child(iteration: Iteration, stage: str, command: list[str], watch: Watch, stdout: Path | None = None) -> None:
    """Run one trainer command to its end, recording the child on the entry (host, pgid) and its progress; raises
    Cancelled (the group killed) or IterationError when it fails."""
    entry = iteration.stages[stage]
    proc = subprocesses.start(command, log=watch.log, cwd=Path(settings.BASE_DIR), env=trainer_env(), stdout=stdout)
    entry.update(host=socket.gethostname(), pgid=proc.pid, command=command, run_dir=str(run_dir(iteration, stage)))
    watch.write()
    started = time.monotonic()
    try:
        code = subprocesses.wait(proc, tick=watch.tick, every=TICK_S)
    except (Cancelled, subprocesses.Stopped):
        raise Cancelled from None
    finally:  # the trainer's own wall time: the iteration's overhead is the rest
        entry["child_seconds"] = round(entry.get("child_seconds", 0.0) + time.monotonic() - started, 3)
    watch.read()
    watch.write()
    if code != 0:
        tail = "\n".join(subprocesses.tail(watch.log, 15))
        raise IterationError(f"`{' '.join(command[:6])} …` exited with {code}; the log ends:\n{tail}")


def run_training_stage(iteration: Iteration, stage: str) -> dict[str, Any]:
    """Run CT, SFT, value pretraining or PPO as the trainer's CLI; the last stage of the model chain registers its
    result. Returns the stage's output (checkpoint, last metrics, model id)."""
    out = trainer_dir(iteration, stage)
    _prepare(iteration, stage, run_dir(iteration, stage))
    resume = out.is_dir() and any(out.glob("checkpoint-*"))
    if not resume:
        shutil.rmtree(out, ignore_errors=True)  # a run that died before its first checkpoint starts over, clean
    command = training_command(iteration, stage, resume=resume)
    watch = Watch(iteration, stage, out / "metrics.jsonl", run_dir(iteration, stage) / "log.txt")
    run_child(iteration, stage, command, watch)
    result = output_of(iteration, stage)
    if not result.is_dir():
        raise IterationError(f"the trainer finished without writing {result}")
    output: dict[str, Any] = {"checkpoint": str(result), "metrics": watch.last(), "resumed": resume}
    if stage == last_of_chain(iteration):
        model = _registry("register_model")(iteration, stage=stage, checkpoint=str(result), metrics=watch.last())
        output["model_id"] = model.pk
        output["model"] = model.name
    return output


def _registry(name: str) -> Any:
    try:
        from . import registry
    except ImportError:
        raise IterationError(f"the model registry is not installed (flywheel.registry.{name})") from None
    function = getattr(registry, name, None)
    if function is None:
        raise IterationError(f"the model registry has no {name}()")
    return function


# --- evaluation -------------------------------------------------------------------------------------------------------


EVAL_EPISODES = 64  # episodes an evaluation plays when config.evaluate names none (the trainer's own default)


def eval_episodes(iteration: Iteration) -> int:
    """Episodes each evaluation of the iteration plays (config.evaluate.episodes, else EVAL_EPISODES)."""
    return int((iteration.config.get("evaluate") or {}).get("episodes") or EVAL_EPISODES)


def eval_command(iteration: Iteration, model: str, tasks: Path, progress: Path | None = None) -> list[str]:
    settings_ = iteration.config.get("evaluate") or {}
    args = {"env": "sandbox", **{k: v for k, v in settings_.items() if k != "task_ids"}}
    args["episodes"] = eval_episodes(iteration)
    args.update(model=model, tasks=str(tasks), sandbox_url=settings.SANDBOX_URL)
    if progress is not None:
        args["progress"] = str(progress)
    return [sys.executable, "-m", "training", "eval", *options(args)]


def run_evaluate_stage(iteration: Iteration) -> dict[str, Any]:
    """Play the held-out tasks with the new model and with its base; record both on the model and (when
    config.promote is "auto") let the registry promote it. A result already written is not played again."""
    chain = last_of_chain(iteration)
    trained = iteration.stages.get(chain or "", {}).get("output") or {}
    model = ModelVersion.objects.filter(pk=trained.get("model_id")).first()
    if model is None:
        raise IterationError("evaluation needs the model this iteration trained (a CT, SFT or PPO stage)")
    tasks = heldout_tasks(iteration.config)
    if not tasks:
        raise IterationError('no held-out tasks to evaluate on (tasks with an evaluator and metadata.split "heldout")')
    where = run_dir(iteration, Stage.EVALUATE)
    _prepare(iteration, Stage.EVALUATE, where)
    task_file = write_task_file(tasks, where / "heldout.jsonl")
    runs = {"new": model.checkpoint_uri, "parent": base_checkpoint(iteration)}
    setup = evaluation_setup(iteration, tasks)
    results: dict[str, dict[str, Any]] = {}
    earlier = _earlier_result(iteration.base_model, setup)
    if earlier is not None:  # the base was measured the same way when its own iteration evaluated it
        results["parent"] = earlier
        runs.pop("parent")
    # progress counts episodes over the runs still to play (each writes one line per episode it ends)
    episodes = eval_episodes(iteration)
    total = len(runs) * episodes
    watch = Watch(iteration, Stage.EVALUATE, where / "none.jsonl", where / "log.txt", total=total, plot=False)
    for n, (name, checkpoint) in enumerate(runs.items()):
        progress(iteration, Stage.EVALUATE, n * episodes, total)
        found = _result(where / f"{name}.json")
        if found is None:
            played = where / f"{name}.progress.jsonl"
            played.unlink(missing_ok=True)  # a run cut short starts over
            watch.follow(played, before=n * episodes)
            run_child(iteration, Stage.EVALUATE, eval_command(iteration, checkpoint, task_file, played), watch,
                      stdout=where / f"{name}.json.part")  # fmt: skip
            (where / f"{name}.json.part").replace(where / f"{name}.json")
            found = _result(where / f"{name}.json")
            if found is None:
                raise IterationError(f"the evaluation of {name} printed no JSON result (see {where / 'log.txt'})")
        results[name] = {**found, "setup": setup}
    progress(iteration, Stage.EVALUATE, total, total)
    output: dict[str, Any] = {**results, "model_id": model.pk, "parent_id": iteration.base_model_id}
    _registry("record_evaluation")(model, results["new"], results["parent"])
    if iteration.config.get("promote") == "auto":
        output["promoted"] = bool(_registry("auto_promote")(iteration, model))
    output["finished_at"] = timezone.now().isoformat()
    return output


def evaluation_setup(iteration: Iteration, tasks: list[Task]) -> str:
    """A digest of what an evaluation plays: the held-out tasks (id, instruction, setup, evaluator) and the evaluate
    settings. The same checkpoint measured under the same setup is the same measurement."""
    settings_ = {k: v for k, v in (iteration.config.get("evaluate") or {}).items() if k != "task_ids"}
    rows = [[t.pk, t.instruction, t.setup_config, t.evaluator] for t in tasks]
    payload = json.dumps({"tasks": rows, "settings": settings_}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _earlier_result(base: ModelVersion | None, setup: str) -> dict[str, Any] | None:
    """The base model's own held-out result when an earlier evaluation measured it under `setup` (the iteration
    that trained it, or an earlier iteration on the same base, e.g. the untrained agent that was not replaced), marked
    as reused; None when it must be played again."""
    if base is None:
        return None
    found = (base.evaluation or {}).get("new") or {}
    if found.get("setup") == setup:
        return {**found, "reused_from_iteration": (base.evaluation or {}).get("iteration")}
    earlier = (
        Iteration.objects.filter(
            base_model=base, status=Iteration.Status.SUCCEEDED, stages__evaluate__output__parent__setup=setup
        )
        .exclude(stages__evaluate__output__parent__has_key="reused_from_iteration")
        .order_by("-id")
        .only("id", "stages")
        .first()
    )
    if earlier is None:
        return None
    return {**earlier.stages["evaluate"]["output"]["parent"], "reused_from_iteration": earlier.pk}


def _result(path: Path) -> dict[str, Any] | None:
    """The last JSON object line of an eval's stdout, or None."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
