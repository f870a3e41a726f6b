"""Does the agent pick the element the instruction names, or guess? From evaluation episodes, per task family: the
clicks made where the instruction quotes the label of an element of the clicked role, how many landed on such an
element, and how many a uniform guess among the elements of that role would land on (the chance baseline, in the
same run). A ratio near 1 means the agent learnt the flow (which role, when to finish) but not to ground the label.

    python -m training eval --env sandbox:max_steps=6 --tasks heldout.jsonl --model M --out var/eval-m …
    python bench/grounding.py var/eval-m/episodes.jsonl [more episodes.jsonl …]

It reads the episodes `training eval --out` writes (the prompts the model saw, outlines included, and its replies);
it runs nothing itself.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox.action_regex import GROUNDED_VERBS, instruction_quotes, outline_points
from training.data import Episode, read_episodes
from training.policy.grounding import OUTLINE_HEADING

_CLICK = re.compile(rf"^Thought: I (?:{'|'.join(map(re.escape, GROUNDED_VERBS.values()))}) (?P<line>.+ \(\d+,\d+\))\.$",
                    re.M)  # fmt: skip
_LABEL = re.compile(r'^(?P<role>\S+) (?P<label>"(?:[^"\\]|\\.)*")')
_FAMILY = re.compile(r"suite-(?P<family>.+?)-(?:heldout|train)-s\d+")


@dataclass
class Tally:
    """One family's named clicks: made, on a named element, and expected on one by a uniform guess."""

    episodes: int = 0
    clicks: int = 0
    on_named: int = 0
    by_chance: float = 0.0


def _element(line: str) -> tuple[str, str] | None:
    found = _LABEL.match(line)
    return (found["role"], json.loads(found["label"])) if found else None


def _text_parts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [part.get("text", "") for part in content or [] if part.get("type") == "text"]


def named_clicks(episode: Episode) -> list[tuple[bool, float]]:
    """For each click of the episode on an outlined element whose role has an element the instruction names: whether
    it hit a named one, and the share of that role's elements that are named (a uniform guess's chance)."""
    quotes = set(instruction_quotes(episode.instruction))
    outline: list[str] = []
    out = []
    for message in episode.messages:
        texts = _text_parts(message.get("content"))
        if message.get("role") == "user":
            for text in texts:
                if text.startswith(OUTLINE_HEADING):
                    outline = [line for line, _, _ in outline_points(text)]
            continue
        if message.get("role") != "assistant":
            continue
        found = _CLICK.search("\n".join(texts))
        clicked = _element(found["line"]) if found else None
        if clicked is None:
            continue
        same_role = [e for e in map(_element, outline) if e is not None and e[0] == clicked[0]]
        named = [e for e in same_role if e[1] in quotes]
        if named:
            out.append((clicked[1] in quotes, len(named) / len(same_role)))
    return out


def tally(paths: list[Path]) -> dict[str, Tally]:
    """Named clicks per family over the episodes of `paths`."""
    families: dict[str, Tally] = defaultdict(Tally)
    for path in paths:
        for episode in read_episodes(path):
            found = _FAMILY.search(episode.id)
            t = families[found["family"] if found else "?"]
            t.episodes += 1
            for hit, chance in named_clicks(episode):
                t.clicks += 1
                t.on_named += hit
                t.by_chance += chance
    return dict(sorted(families.items()))


def table(families: dict[str, Tally]) -> str:
    """The markdown table: per family and overall, named clicks, hits, chance and their ratio."""
    total = Tally(
        episodes=sum(t.episodes for t in families.values()),
        clicks=sum(t.clicks for t in families.values()),
        on_named=sum(t.on_named for t in families.values()),
        by_chance=sum(t.by_chance for t in families.values()),
    )
    rows = [
        "| family | episodes | named clicks | on a named element | by chance | × chance |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, t in [*families.items(), ("all", total)]:
        ratio = f"{t.on_named / t.by_chance:.2f}" if t.by_chance else "—"
        share = f"{t.on_named} ({t.on_named / t.clicks:.0%})" if t.clicks else "0"
        chance = f"{t.by_chance:.1f} ({t.by_chance / t.clicks:.0%})" if t.clicks else "—"
        rows.append(f"| {name} | {t.episodes} | {t.clicks} | {share} | {chance} | {ratio} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("episodes", nargs="+", type=Path, help="episodes.jsonl from `training eval --out`")
    args = parser.parse_args()
    missing = [str(p) for p in args.episodes if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(table(tally(args.episodes)))


if __name__ == "__main__":
    main()
