"""The stores' other export formats, written from the same episodes as the trainer's JSONL (flywheel/export.py) so
every format has the same rows, text and coordinates (already in the model's frame: no conversion happens here).

One writer per format, each streaming to a local file (bounded memory: Parquet goes out in row groups). They live in
the store's `formats/` folder, out of the store directory's top level that the trainer reads whole (every `*.jsonl`
there is an episode file); image paths in them are relative to the file (`../images/t<trajectory>/<step>.png`):

    chat-v0003.jsonl      Hugging Face / TRL conversational rows: {"messages": [{role, content: [parts]}], "images"}
                          with `{"type": "image"}` placeholders in order and image paths relative to the file
    sharegpt-v0003.jsonl  LLaMA-Factory's sharegpt layout: string contents with `<image>` markers, user/assistant
                          alternating, "images" relative to the file (LLaMA-Factory's dataset_dir: the folder)
    data-v0003.parquet    the chat rows as Parquet for `datasets.load_dataset("parquet", ...)`: images as bytes
                          (the `Image` feature, decoded to PIL) or as relative paths (strings)
    corpus-v0003.jsonl    CT only: the interleaved text+image corpus (OBELICS-style aligned `texts` / `images`
                          lists), with the in-situ capture's transcript (text and word timings) per step

No Django here: the exporter gives each writer a `Record` (the episode, its images' bytes, its transcripts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training.data import Episode

SUBDIR = "formats"  # the other formats' folder in a store directory
PREFIX = "../"  # from that folder to the episode files' image paths
IMAGE = "<image>"  # LLaMA-Factory's image placeholder in sharegpt text
PARQUET_IMAGES = ("bytes", "paths")
ROW_GROUP_ROWS = 256  # a Parquet row group closes at this many rows…
ROW_GROUP_BYTES = 16 << 20  # …or at this many bytes of images, whichever comes first (peak memory ~8x this)


@dataclass
class StepTranscript:
    """What the annotator said during one step of an in-situ capture: the raw transcript and its timed words."""

    step: int
    text: str
    words: list[dict[str, Any]] = field(default_factory=list)  # {text, start, end} on the capture's clock


@dataclass
class Record:
    """One trajectory as every writer gets it: the episode, its images (paths as in the episode, bytes as written)
    and, for in-situ trajectories, the transcript of each step."""

    episode: Episode
    images: list[tuple[str, bytes]]
    transcripts: list[StepTranscript] = field(default_factory=list)


class Writer(Protocol):
    role: str
    path: Path

    def add(self, record: Record) -> None: ...

    def close(self) -> None: ...


def image_paths(episode: Episode, prefix: str = PREFIX) -> list[str]:
    """The episode's image paths in conversation order, relative to a file in the formats folder."""
    return [
        prefix + part["image"]
        for message in episode.messages
        if isinstance(message["content"], list)
        for part in message["content"]
        if part.get("type") == "image"
    ]


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "image", "text": None} if p["type"] == "image" else dict(p) for p in content]


def chat_messages(episode: Episode) -> list[dict[str, Any]]:
    """The episode as Hugging Face conversational messages: typed parts, image placeholders without payload (TRL
    fills them from the row's `images`), consecutive messages of one role merged so the roles alternate."""
    out: list[dict[str, Any]] = []
    for message in episode.messages:
        parts = _parts(message["content"])
        if out and out[-1]["role"] == message["role"]:
            out[-1]["content"].extend(parts)
        else:
            out.append({"role": message["role"], "content": parts})
    return out


def sharegpt_messages(episode: Episode) -> list[dict[str, str]]:
    """The chat messages with string contents, `<image>` where each image goes (LLaMA-Factory's sharegpt)."""
    return [
        {
            "role": m["role"],
            "content": "\n".join(IMAGE if p["type"] == "image" else p["text"] for p in m["content"]),
        }
        for m in chat_messages(episode)
    ]


def _meta(episode: Episode) -> dict[str, Any]:
    return {k: v for k, v in episode.meta.items() if k != "base_dir"}


def _row(episode: Episode) -> dict[str, Any]:
    return {
        "id": episode.id,
        "trajectory_id": episode.meta.get("trajectory_id"),
        "source": episode.source,
        "instruction": episode.instruction,
        "reward": episode.reward,
    }


class _Lines:
    """A JSON Lines file written one record at a time."""

    role = ""

    def __init__(self, path: Path):
        self.path = path
        self._out = open(path, "w", encoding="utf-8")

    def line(self, data: dict[str, Any]) -> None:
        self._out.write(json.dumps(data, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._out.close()


class ChatWriter(_Lines):
    """chat-vNNNN.jsonl: conversational rows for TRL's SFTTrainer / `datasets` (`messages` + `images`)."""

    role = "chat"

    def add(self, record: Record) -> None:
        episode = record.episode
        self.line(
            {
                **_row(episode),
                "messages": chat_messages(episode),
                "images": image_paths(episode),
                "meta": _meta(episode),
            }
        )


class ShareGPTWriter(_Lines):
    """sharegpt-vNNNN.jsonl: LLaMA-Factory's multimodal sharegpt rows (`messages` + `images`)."""

    role = "sharegpt"

    def add(self, record: Record) -> None:
        episode = record.episode
        self.line({**_row(episode), "messages": sharegpt_messages(episode), "images": image_paths(episode)})


class CorpusWriter(_Lines):
    """corpus-vNNNN.jsonl (CT store): one interleaved document per trajectory. `texts` and `images` are aligned lists,
    one of the two set at each position: the instruction, then per step its screenshot, what the annotator said
    (in-situ) and the step's `Thought/Action`; `transcripts` keeps each step's words with their times."""

    role = "corpus"

    def add(self, record: Record) -> None:
        episode = record.episode
        spoken = {t.step: t for t in record.transcripts}
        texts: list[str | None] = [episode.instruction]
        images: list[str | None] = [None]
        step = 0
        for message in episode.messages[1:]:
            content = message["content"]
            if isinstance(content, list):  # the step's screenshot (and any text beside it)
                for part in content:
                    texts.append(part["text"] if part["type"] == "text" else None)
                    images.append(PREFIX + part["image"] if part["type"] == "image" else None)
                said = spoken.get(step)
                if said is not None and said.text:
                    texts.append(said.text)
                    images.append(None)
            elif message["role"] == "assistant":
                texts.append(content)
                images.append(None)
                step += 1
            else:
                texts.append(content)
                images.append(None)
        self.line(
            {
                **_row(episode),
                "texts": texts,
                "images": images,
                "transcripts": [
                    {"step": t.step, "text": t.text, "words": t.words} for t in sorted(spoken.values(), key=_step)
                ],
                "meta": _meta(episode),
            }
        )


def _step(transcript: StepTranscript) -> int:
    return transcript.step


def parquet_schema(images: str) -> Any:
    """The Parquet schema, with the Hugging Face features in its metadata so `datasets` decodes `images` (bytes) as
    `Image` and the messages keep their typed parts."""
    import pyarrow as pa

    string = {"dtype": "string", "_type": "Value"}
    part = pa.struct([("type", pa.string()), ("text", pa.string())])
    message = pa.struct([("role", pa.string()), ("content", pa.list_(part))])
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())]) if images == "bytes" else pa.string()
    features = {
        "id": string,
        "trajectory_id": {"dtype": "int64", "_type": "Value"},
        "source": string,
        "instruction": string,
        "reward": {"dtype": "float64", "_type": "Value"},
        "messages": {
            "feature": {"role": string, "content": {"feature": {"type": string, "text": string}, "_type": "List"}},
            "_type": "List",
        },
        "images": {"feature": {"_type": "Image"} if images == "bytes" else string, "_type": "List"},
        "meta": string,
    }
    return pa.schema(
        [
            ("id", pa.string()),
            ("trajectory_id", pa.int64()),
            ("source", pa.string()),
            ("instruction", pa.string()),
            ("reward", pa.float64()),
            ("messages", pa.list_(message)),
            ("images", pa.list_(image)),
            ("meta", pa.string()),
        ],
        metadata={"huggingface": json.dumps({"info": {"features": features}})},
    )


def leaves(schema: Any) -> list[str]:
    """The Parquet column paths of an Arrow schema's leaves (`images.list.element.bytes`), for per-column options."""
    import pyarrow as pa

    def walk(prefix: str, kind: Any) -> list[str]:
        if pa.types.is_list(kind):
            return walk(f"{prefix}.list.element", kind.value_type)
        if pa.types.is_struct(kind):
            return [leaf for f in kind for leaf in walk(f"{prefix}.{f.name}", f.type)]
        return [prefix]

    return [leaf for f in schema for leaf in walk(f.name, f.type)]


def parquet_options(schema: Any) -> dict[str, Any]:
    """Writer options: zstd except on the image bytes (PNG/JPEG: compressing them again costs time and saves
    nothing); dictionary encoding only where values repeat (tried on the images it costs memory and gains nothing)."""
    return {
        "compression": {leaf: "none" if leaf == "images.list.element.bytes" else "zstd" for leaf in leaves(schema)},
        "use_dictionary": ["source", "instruction"],
        "write_statistics": False,
    }


class ParquetWriter:
    """data-vNNNN.parquet: the chat rows, `meta` as a JSON string, images as bytes (the `Image` feature: path beside
    the bytes) or as paths relative to the file; flushed a row group at a time."""

    role = "parquet"

    def __init__(self, path: Path, images: str = "bytes"):
        import pyarrow.parquet as pq

        if images not in PARQUET_IMAGES:
            raise ValueError(f"parquet images must be one of {', '.join(PARQUET_IMAGES)}, not {images!r}")
        self.path = path
        self.images = images
        self.schema = parquet_schema(images)
        self._writer = pq.ParquetWriter(path, self.schema, **parquet_options(self.schema))
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0
        self.row_groups = 0

    def add(self, record: Record) -> None:
        episode = record.episode
        if self.images == "bytes":
            images: list[Any] = [{"bytes": data, "path": PREFIX + path} for path, data in record.images]
            self._bytes += sum(len(data) for _, data in record.images)
        else:
            images = image_paths(episode)
        self._rows.append(
            {
                **_row(episode),
                "messages": chat_messages(episode),
                "images": images,
                "meta": json.dumps(_meta(episode), ensure_ascii=False),
            }
        )
        if len(self._rows) >= ROW_GROUP_ROWS or self._bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._rows:
            return
        self._writer.write_table(pa.Table.from_pylist(self._rows, schema=self.schema), row_group_size=len(self._rows))
        self._rows, self._bytes = [], 0
        self.row_groups += 1

    def close(self) -> None:
        self._flush()
        self._writer.close()


def writers(kind: str, directory: Path, tag: str, *, parquet_images: str = "bytes") -> list[Writer]:
    """The writers of a store version's other formats, files named by `tag` (e.g. v0003) in `directory`."""
    out: list[Writer] = [
        ParquetWriter(directory / f"data-{tag}.parquet", parquet_images),
        ChatWriter(directory / f"chat-{tag}.jsonl"),
        ShareGPTWriter(directory / f"sharegpt-{tag}.jsonl"),
    ]
    if kind == "ct":
        out.append(CorpusWriter(directory / f"corpus-{tag}.jsonl"))
    return out


def describe(kind: str, tag: str, parquet_images: str) -> dict[str, Any]:
    """The manifest's `formats` section: which formats this version has, their files and how to load them."""
    formats: dict[str, Any] = {
        "episodes": {"file": f"episodes-{tag}.jsonl", "reader": "training.data.read_episodes"},
        "parquet": {
            "file": f"{SUBDIR}/data-{tag}.parquet",
            "images": parquet_images,
            "reader": "datasets.load_dataset('parquet', data_files=...)",
        },
        "chat": {
            "file": f"{SUBDIR}/chat-{tag}.jsonl",
            "for": "TRL SFTTrainer (messages + images, paths relative to the file)",
        },
        "sharegpt": {
            "file": f"{SUBDIR}/sharegpt-{tag}.jsonl",
            "for": "LLaMA-Factory (dataset_dir: the formats folder)",
            "dataset_info": {
                "file_name": f"sharegpt-{tag}.jsonl",
                "formatting": "sharegpt",
                "columns": {"messages": "messages", "images": "images"},
                "tags": {
                    "role_tag": "role",
                    "content_tag": "content",
                    "user_tag": "user",
                    "assistant_tag": "assistant",
                },
            },
        },
    }
    if kind == "ct":
        formats["corpus"] = {
            "file": f"{SUBDIR}/corpus-{tag}.jsonl",
            "layout": "interleaved texts/images (aligned lists), in-situ transcripts per step",
        }
    return formats
