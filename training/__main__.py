"""`python -m training <stage> [--option value ...]`: every stage of the trainer from the command line (and from the
flywheel's Celery tasks). Each stage's options are the fields of its config dataclass; `--help` lists them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Any

from training.models import LoraSettings
from training.ppo import PPOConfig, pretrain_value, train_ppo
from training.rewards import Shaping
from training.sft import SFTConfig, train_sft

NESTED = {"lora": LoraSettings, "shaping": Shaping}
EVAL_OPTIONS = (
    "episodes",
    "seed",
    "temperature",
    "max_new_tokens",
    "max_turns",
    "tasks",
    "sandbox_url",
    "sandbox_api_key",
    "base_url",
    "served_model",
    "api_key",
    "success_threshold",
    "concurrency",
    "out",
    "progress",
)


def add_dataclass_options(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """One --flag per field (nested configs as --lora-r, --shaping-format-penalty); required fields stay required."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if f.name in NESTED:
            add_dataclass_options(parser, NESTED[f.name], prefix=f"{f.name}_")
            continue
        kind = hints[f.name]
        flag = "--" + name.replace("_", "-")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, dest=name, type=kind, required=required,
                                default=None if required else f.default)  # fmt: skip


def build_config(cls: type, args: argparse.Namespace) -> Any:
    values = vars(args)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in NESTED:
            sub = NESTED[f.name]
            kwargs[f.name] = sub(**{g.name: values[f"{f.name}_{g.name}"] for g in dataclasses.fields(sub)})
        else:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    stages = parser.add_subparsers(dest="stage", required=True)

    tiny = stages.add_parser("tiny", help="write a tiny random checkpoint built from a config (no download)")
    tiny.add_argument("out", type=Path)
    tiny.add_argument("--vision", action="store_true", help="Qwen2.5-VL instead of the text-only Qwen2")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden", type=int, default=64)
    tiny.add_argument("--layers", type=int, default=2)

    agent = stages.add_parser("agent-init", help="write the untrained suite agent (training/agent.py, docs/agent.md)")
    agent.add_argument("--out", type=Path, required=True)
    agent.add_argument("--hidden", type=int, default=64)
    agent.add_argument("--layers", type=int, default=3)
    agent.add_argument("--heads", type=int, default=2)
    agent.add_argument("--image-tokens", type=int, default=16, help="screenshot size in 28-pixel vision tokens")
    agent.add_argument("--seed", type=int, default=0)

    drill = stages.add_parser("agent-drill", help="pre-train an agent on grounding drills: instructions naming one "
                              "line of a page outline (training/drills.py, docs/agent.md)")  # fmt: skip
    drill.add_argument("--model", type=Path, required=True, help="the agent to start from (agent-init's --out)")
    drill.add_argument("--out", type=Path, required=True, help="run directory; the drilled agent is OUT/final")
    drill.add_argument("--count", type=int, default=32_000, help="drills, one pass")
    drill.add_argument("--batch", type=int, default=32, help="drills per optimizer step")
    drill.add_argument("--lr", type=float, default=3e-3)
    drill.add_argument("--seed", type=int, default=0)
    drill.add_argument("--no-progress", dest="progress", action="store_false")

    demos = stages.add_parser("demos", help="expert episodes of a built-in environment (an SFT store to start from)")
    demos.add_argument("--env", default="copy")
    demos.add_argument("--episodes", type=int, default=256)
    demos.add_argument("--seed", type=int, default=10_000)
    demos.add_argument("--out", type=Path, required=True)

    for name, cls, text in (("sft", SFTConfig, "supervised fine-tuning on the model's turns"),
                            ("ct", SFTConfig, "continual pre-training on every token"),
                            ("value", PPOConfig, "value pretraining: critic only, policy fixed, until it settles"),
                            ("ppo", PPOConfig, "multi-turn PPO")):  # fmt: skip
        sub = stages.add_parser(name, help=text)
        add_dataclass_options(sub, cls)

    evaluate = stages.add_parser("eval", help="success rate (Wilson 95 %% interval) and mean return of a model on a "
                                 "built-in environment or on sandbox tasks; prints one JSON object")  # fmt: skip
    evaluate.add_argument("--model", required=True, help="checkpoint directory (or, with --base-url, a label)")
    evaluate.add_argument("--env", default="copy", help='"copy", "guess", or "sandbox[:max_steps=8]" with --tasks')
    evaluate.add_argument("--episodes", type=int, default=64)
    evaluate.add_argument("--seed", type=int, default=1_000_000, help="first seed; task n mod count")
    evaluate.add_argument("--temperature", type=float, default=0.0)
    evaluate.add_argument("--max-new-tokens", type=int, default=32)
    evaluate.add_argument("--max-turns", type=int, default=32)
    evaluate.add_argument("--tasks", default="", help="sandbox: JSON list or JSONL of OSWorld-format tasks")
    evaluate.add_argument("--sandbox-url", default="", help="default: $SANDBOX_URL, else http://127.0.0.1:8010")
    evaluate.add_argument("--sandbox-api-key", default="", help="default: $SANDBOX_API_KEY")
    evaluate.add_argument("--base-url", default="", help="play through this OpenAI-compatible endpoint (…/v1)")
    evaluate.add_argument("--served-model", default="", help="the model's name at --base-url (default: --model)")
    evaluate.add_argument("--api-key", default="", help="the endpoint's API key")
    evaluate.add_argument("--success-threshold", type=float, default=1.0, help="success: score at least this")
    evaluate.add_argument("--concurrency", type=int, default=4, help="episodes at once (sandbox, --base-url)")
    evaluate.add_argument("--out", default="", help="keep screenshots and episodes.jsonl here")
    evaluate.add_argument("--progress", default="", help='append {"step": n, "episodes": total} here as episodes end')

    plot = stages.add_parser("plot", help="draw metrics.jsonl curves to a PNG")
    plot.add_argument("run", type=Path, help="a run directory or its metrics.jsonl")
    plot.add_argument("--out", type=Path, required=True)
    plot.add_argument("--keys", nargs="+", default=["reward", "entropy", "explained_variance"])

    args = parser.parse_args(argv)
    # Stopped by a supervisor (Celery revoking the stage): unwind like Ctrl-C, so sandbox sessions are given back.
    main_thread = threading.current_thread() is threading.main_thread()  # signals can be handled there only
    previous = signal.signal(signal.SIGTERM, _interrupted) if main_thread else None
    try:
        return run(args)
    except ValueError as exc:  # a bad option or input file: its message, not a traceback
        parser.exit(2, f"error: {exc}\n")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM, after every `finally` ran (sessions given back)
        print(f"interrupted ({exc or 'Ctrl-C'})", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    """Run the chosen stage; its result is printed as one JSON line (or a path)."""
    if args.stage == "tiny":
        from training.policy.tiny import build_tiny_checkpoint, build_tiny_text_checkpoint

        build = build_tiny_checkpoint if args.vision else build_tiny_text_checkpoint
        print(build(args.out, seed=args.seed, hidden=args.hidden, layers=args.layers))
    elif args.stage == "agent-init":
        from training.agent import AgentConfig, build_agent

        config = AgentConfig(hidden=args.hidden, layers=args.layers, heads=args.heads,
                             image_tokens=args.image_tokens, seed=args.seed)  # fmt: skip
        print(build_agent(args.out, config))
    elif args.stage == "agent-drill":
        from training.drills import drill_agent

        print(drill_agent(args.model, args.out, count=args.count, seed=args.seed, batch=args.batch, lr=args.lr,
                          progress=args.progress))  # fmt: skip
    elif args.stage == "demos":
        from training.evaluate import write_demonstrations

        print(f"{write_demonstrations(args.env, args.episodes, args.out, args.seed)} episodes → {args.out}")
    elif args.stage in ("sft", "ct"):
        cfg = build_config(SFTConfig, args)
        cfg.mode = args.stage
        print(json.dumps(train_sft(cfg)))
    elif args.stage == "value":
        print(json.dumps(pretrain_value(build_config(PPOConfig, args))))
    elif args.stage == "ppo":
        print(json.dumps(train_ppo(build_config(PPOConfig, args))))
    elif args.stage == "eval":
        from training.evaluate import evaluate_checkpoint

        options = {k: getattr(args, k) for k in EVAL_OPTIONS}
        print(json.dumps(evaluate_checkpoint(args.model, args.env, **options)))
    elif args.stage == "plot":
        from training.metrics import plot as draw

        print(draw(args.run, args.out, tuple(args.keys)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
