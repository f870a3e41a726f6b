"""The trainer's on-disk trajectory format (episodes as JSON Lines) and its rendering into tokens with a loss mask.

One episode a line, in chat-message form: the SFT/CT trainers read it, and the rollouts (`training.rollout`, built-in
and sandbox environments) and the `demos` stage write it. Images are file paths relative to the file; a rollout sends
them to the policy server as OpenAI `image_url` data URLs. The flywheel's SFT and CT stores are written in this
format by `flywheel/export.py`, so the trainer reads them as they are.

    {"id": "t-17", "source": "interactive", "instruction": "Open the settings", "reward": 1.0,
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": [{"type": "text", "text": "..."}, {"type": "image", "image": "s/0.png"}]},
                  {"role": "assistant", "content": "Thought: ...\\nAction: click(...)", "reward": 0.0, "version": 3}],
     "meta": {...}}

`reward` on the episode is the outcome; `reward` on an assistant message is a per-turn reward (format, step penalty);
`version` is the policy version that generated that turn (rollouts only). Image paths are relative to the file.
Files may be gzip-compressed (`.jsonl.gz`); they are read one line at a time, so stores of any size stream.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROLES = ("system", "user", "assistant")


class EpisodeFormatError(ValueError):
    """A line of an episode file is not a valid episode; the message names the file, the line and the field."""


@dataclass
class Episode:
    """A multi-turn trajectory: chat messages, an outcome reward and where it came from."""

    messages: list[dict[str, Any]]
    id: str = ""
    reward: float | None = None
    source: str = "rollout"
    instruction: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")


def validate(data: Any, where: str) -> Episode:
    """An Episode from a decoded JSON object, or EpisodeFormatError naming `where` and the field."""
    if not isinstance(data, dict):
        raise EpisodeFormatError(f"{where}: an episode is a JSON object")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EpisodeFormatError(f"{where}: 'messages' must be a non-empty list")
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise EpisodeFormatError(f"{where}: messages[{n}].role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise EpisodeFormatError(f"{where}: messages[{n}].content must be a string or a list of parts")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
                    raise EpisodeFormatError(f"{where}: messages[{n}] has a part that is not text or image")
        if message["role"] == "assistant" and not isinstance(content, str):
            raise EpisodeFormatError(f"{where}: messages[{n}] (assistant) content must be a string")
    reward = data.get("reward")
    if reward is not None and not isinstance(reward, (int, float)):
        raise EpisodeFormatError(f"{where}: 'reward' must be a number or null")
    known = {"messages", "id", "reward", "source", "instruction", "meta"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise EpisodeFormatError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return Episode(**data)


def _open(path: Path, mode: str, gzipped: bool):  # type: ignore[no-untyped-def]
    return gzip.open(path, mode + "t", encoding="utf-8") if gzipped else open(path, mode, encoding="utf-8")


def read_episodes(path: str | Path) -> Iterator[Episode]:
    """Stream episodes from a JSONL(.gz) file, or from every such file in a directory (sorted by name)."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))) if path.is_dir() else [path]
    for file in files:
        with _open(file, "r", file.suffix == ".gz") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise EpisodeFormatError(f"{file}:{number}: not JSON ({exc.msg})") from None
                episode = validate(data, f"{file}:{number}")
                episode.meta.setdefault("base_dir", str(file.parent))
                yield episode


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> int:
    """Write episodes as JSONL(.gz); returns how many. Written to a temporary name, then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    count = 0
    with _open(tmp, "w", path.suffix == ".gz") as handle:
        for episode in episodes:
            meta = {k: v for k, v in episode.meta.items() if k != "base_dir"}
            handle.write(Episode(**{**asdict(episode), "meta": meta}).to_json() + "\n")
            count += 1
    tmp.replace(path)
    return count


@dataclass
class Sample:
    """One rendered episode: token ids, the loss mask (1 on the model's own tokens), and per-token rewards placed on
    the last generated token of each turn (the outcome goes on the last turn)."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    rewards: torch.Tensor
    versions: torch.Tensor
    turn_ends: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    episode: Episode | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


class Renderer:
    """Renders episodes with a checkpoint's chat template: message by message, so every assistant turn's tokens
    (through its end-of-turn token) are known exactly and get loss-mask 1; headers, system, user and observation
    tokens get 0. With `mode="ct"` (continual pre-training) every token is trained."""

    def __init__(self, tokenizer: Any, *, image_processor: Any = None, mode: str = "sft", max_length: int = 8192):
        if mode not in ("sft", "ct"):
            raise ValueError(f"mode must be 'sft' or 'ct', not {mode!r}")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.mode = mode
        self.max_length = max_length
        self.eos = tokenizer.eos_token
        self.image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>") if image_processor is not None else None
        self.vision_tokens = vision_token_ids(tokenizer)

    def template(self, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
        plain = [{"role": m["role"], "content": _template_content(m["content"])} for m in messages]
        return self.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=generation_prompt)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the conversation so far plus the assistant header: what the policy continues."""
        return self._encode(self.template(messages, generation_prompt=True))

    def prompt_inputs(self, messages: list[dict[str, Any]], base_dir: str | Path = ".") -> dict[str, Any]:
        """What the policy continues, images included: `input_ids` (image pads expanded, as the model sees them) and,
        when the conversation has images (paths relative to `base_dir`), `pixel_values` and `image_grid_thw`."""
        images = self._load_images(image_paths(messages), Path(base_dir), "the conversation")
        ids, _ = self._expand_images(self.prompt_ids(messages), images["grids"], 0)
        out: dict[str, Any] = {"input_ids": ids}
        if images["pixel_values"]:
            out["pixel_values"] = torch.cat(images["pixel_values"])
            out["image_grid_thw"] = torch.cat(images["grids"])
        return out

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def render(self, episode: Episode) -> Sample:
        pieces: list[tuple[str, int, int]] = []  # (text, trained, version)
        done = ""
        for i, message in enumerate(episode.messages):
            if message["role"] == "assistant":
                head = self.template(episode.messages[:i], generation_prompt=True)
                full = self.template(episode.messages[: i + 1])
                pieces.append((head[len(done) :], 0, -1))
                body = full[len(head) :]
                cut = body.rfind(self.eos) + len(self.eos) if self.eos and self.eos in body else len(body)
                pieces.append((body[:cut], 1, int(message.get("version", -1))))
                pieces.append((body[cut:], 0, -1))
            else:
                full = self.template(episode.messages[: i + 1])
                pieces.append((full[len(done) :], 0, -1))
            done = full
        images = self._images(episode)
        ids: list[int] = []
        mask: list[int] = []
        versions: list[int] = []
        turn_ends: list[int] = []
        next_image = 0
        for text, trained, version in pieces:
            tokens, next_image = self._expand_images(self._encode(text), images["grids"], next_image)
            ids += tokens
            mask += [1 if (trained or self.mode == "ct") else 0] * len(tokens)
            versions += [version] * len(tokens)
            if trained and tokens:
                turn_ends.append(len(ids) - 1)
        if len(ids) > self.max_length:
            ids, mask, versions = ids[: self.max_length], mask[: self.max_length], versions[: self.max_length]
            turn_ends = [t for t in turn_ends if t < self.max_length] or [self.max_length - 1]
        rewards = torch.zeros(len(ids), dtype=torch.float32)
        assistant = [m for m in episode.messages if m["role"] == "assistant"]
        for end, message in zip(turn_ends, assistant, strict=False):
            rewards[end] += float(message.get("reward") or 0.0)
        if turn_ends and episode.reward is not None:
            rewards[turn_ends[-1]] += float(episode.reward)
        pixel_values, grid = (None, None)
        if images["pixel_values"]:
            pixel_values = torch.cat(images["pixel_values"])
            grid = torch.cat(images["grids"])
        return Sample(
            input_ids=torch.tensor(ids, dtype=torch.long),
            loss_mask=torch.tensor(mask, dtype=torch.float32),
            rewards=rewards,
            versions=torch.tensor(versions, dtype=torch.long),
            turn_ends=turn_ends,
            pixel_values=pixel_values,
            image_grid_thw=grid,
            episode=episode,
        )

    def _images(self, episode: Episode) -> dict[str, list[torch.Tensor]]:
        base = Path(episode.meta.get("base_dir", "."))
        return self._load_images(image_paths(episode.messages), base, f"episode {episode.id!r}")

    def _load_images(self, paths: list[str], base: Path, what: str) -> dict[str, list[torch.Tensor]]:
        """Pixel values and grids of images given by paths relative to `base`, in order."""
        found: dict[str, list[torch.Tensor]] = {"pixel_values": [], "grids": []}
        if not paths:
            return found
        if self.image_processor is None:
            raise EpisodeFormatError(f"{what} has images but the checkpoint has no image processor")
        from PIL import Image

        for relative in paths:
            with Image.open(base / relative) as image:
                reduce_for(image, self.image_processor)
                out = self.image_processor(images=[image.convert("RGB")], return_tensors="pt")
            found["pixel_values"].append(out["pixel_values"])
            found["grids"].append(out["image_grid_thw"])
        return found

    def _expand_images(self, tokens: list[int], grids: list[torch.Tensor], index: int) -> tuple[list[int], int]:
        """One image-pad token per vision patch group, as the model's processor would; returns the next image index."""
        if self.image_pad is None or self.image_pad not in tokens:
            return tokens, index
        merge = getattr(self.image_processor, "merge_size", 2) ** 2
        out: list[int] = []
        for token in tokens:
            if token == self.image_pad:
                if index >= len(grids):  # e.g. a reply that spelled out <|image_pad|> (policies suppress it)
                    raise EpisodeFormatError(f"more image placeholders than the episode's {len(grids)} image(s)")
                out += [token] * int(grids[index].prod() // merge)
                index += 1
            else:
                out.append(token)
        return out, index


def reduce_for(image: Any, processor: Any) -> Any:
    """Decode a JPEG far larger than the processor's image at a reduced scale (PIL's draft mode: a tiny model's
    screenshot decodes 5-7x faster), keeping at least twice the final size on each axis so the resize that follows
    still averages; other images, and models that see near full size, are left alone. Training and serving both call
    it, so the model sees the same pixels in both."""
    size = getattr(processor, "size", None)
    limit = getattr(processor, "max_pixels", None) or getattr(size, "longest_edge", None)
    if limit is None and isinstance(size, dict):
        limit = size.get("longest_edge")
    if limit and getattr(image, "format", None) == "JPEG":
        width, height = image.size
        factor = (float(limit) / (width * height)) ** 0.5
        if factor < 0.5:
            image.draft("RGB", (math.ceil(width * factor * 2), math.ceil(height * factor * 2)))
    return image


def image_paths(messages: list[dict[str, Any]]) -> list[str]:
    """The image paths of a conversation, in order."""
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
    return [p["image"] for p in parts if p["type"] == "image"]


def _template_content(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]} for p in content]


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) tensors: input_ids, attention_mask, loss_mask, rewards, versions (+ images if any)."""
    length = max(len(s) for s in samples)
    batch = len(samples)
    out = {
        "input_ids": torch.full((batch, length), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(batch, length, dtype=torch.long),
        "loss_mask": torch.zeros(batch, length),
        "rewards": torch.zeros(batch, length),
        "versions": torch.full((batch, length), -1, dtype=torch.long),
    }
    for row, sample in enumerate(samples):
        n = len(sample)
        out["input_ids"][row, :n] = sample.input_ids
        out["attention_mask"][row, :n] = 1
        out["loss_mask"][row, :n] = sample.loss_mask
        out["rewards"][row, :n] = sample.rewards
        out["versions"][row, :n] = sample.versions
    with_images = [s for s in samples if s.pixel_values is not None]
    if with_images:
        out["pixel_values"] = torch.cat([s.pixel_values for s in with_images])  # type: ignore[misc]
        out["image_grid_thw"] = torch.cat([s.image_grid_thw for s in with_images])  # type: ignore[misc]
    return out


VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def vision_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's vision placeholders: only the renderer may place them, so a policy never generates them
    (a generated <|image_pad|> would ask for an image the episode does not have)."""
    unknown = tokenizer.unk_token_id
    ids = [tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS if t in tokenizer.get_vocab()]
    return [i for i in ids if i is not None and i != unknown]
