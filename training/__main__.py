"""`python -m training <stage> [--option value ...]`: every stage of the trainer from the command line (and from the
flywheel's Celery tasks). Each stage's options are the fields of its config dataclass; `--help` lists them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

from training.models import LoraSettings
from training.ppo import PPOConfig, pretrain_value, train_ppo
from training.rewards import Shaping
from training.sft import SFTConfig, train_sft

NESTED = {"lora": LoraSettings, "shaping": Shaping}


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

    evaluate = stages.add_parser("eval", help="mean return of a checkpoint on a built-in environment")
    evaluate.add_argument("--model", required=True)
    evaluate.add_argument("--env", default="copy")
    evaluate.add_argument("--episodes", type=int, default=64)
    evaluate.add_argument("--seed", type=int, default=1_000_000)
    evaluate.add_argument("--temperature", type=float, default=0.0)
    evaluate.add_argument("--max-new-tokens", type=int, default=32)

    plot = stages.add_parser("plot", help="draw metrics.jsonl curves to a PNG")
    plot.add_argument("run", type=Path, help="a run directory or its metrics.jsonl")
    plot.add_argument("--out", type=Path, required=True)
    plot.add_argument("--keys", nargs="+", default=["reward", "entropy", "explained_variance"])

    args = parser.parse_args(argv)
    if args.stage == "tiny":
        from training.policy.tiny import build_tiny_checkpoint, build_tiny_text_checkpoint

        build = build_tiny_checkpoint if args.vision else build_tiny_text_checkpoint
        print(build(args.out, seed=args.seed, hidden=args.hidden, layers=args.layers))
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

        result = evaluate_checkpoint(args.model, args.env, episodes=args.episodes, seed=args.seed,
                                     temperature=args.temperature, max_new_tokens=args.max_new_tokens)  # fmt: skip
        print(json.dumps(result))
    elif args.stage == "plot":
        from training.metrics import plot as draw

        print(draw(args.run, args.out, tuple(args.keys)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
