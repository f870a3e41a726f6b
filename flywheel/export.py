"""The one exporter of the trainer's episode format (training.data): SFT and CT store versions as episode JSONL plus
screenshots, streamed in chunks (bounded memory), with a manifest of every file and its SHA-256.

Store layout in Django storage (all versions of a store share its directory, so `read_episodes(<store dir>)` reads
the newest version whole, and a version's manifest lists exactly its files, its parents' by reference):

    flywheel/stores/<sft|ct>/episodes-v0003.jsonl     episodes added by version 3 (training.data.Episode per line)
    flywheel/stores/<sft|ct>/images/t<trajectory>/<step>.<ext>   their screenshots, referenced relative to the file
    flywheel/stores/<sft|ct>/rows-v0003.txt           trajectory ids version 3 added, one a line
    flywheel/stores/<sft|ct>/checksums-v0003.sha256   SHA-256 of each screenshot version 3 wrote (sha256sum format)

Actions are stored in screen pixels; here they are converted to the target model's frame (absolute pixels of the
smart-resized image, or relative 0-1000) by sandbox.coordinates alone, and in the absolute frame the screenshots are
resized to the model image's size, so the picture and the coordinates agree.

From the same episodes, each version also writes its other formats (flywheel/formats.py, listed in the manifest's
`files` and `formats`): Parquet for Hugging Face `datasets` (data-v0003.parquet), chat JSONL for TRL
(chat-v0003.jsonl), sharegpt JSONL for LLaMA-Factory (sharegpt-v0003.jsonl) and, in the CT store, the interleaved
text+image corpus with in-situ transcripts (corpus-v0003.jsonl).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from annotation_app.models import Capture, Step, Trajectory
from sandbox.actions import ParsedStep, format_step, parse_actions
from sandbox.coordinates import CoordinateMode, ScreenMapping, map_points
from sandbox.outline import parse as parse_outline
from sandbox.outline import render as render_outline
from training.data import Episode
from training.policy.prompts import COMPUTER_USE

from . import formats
from .formats import Record, StepTranscript
from .locks import advisory_lock
from .models import DatasetVersion, Iteration, Route, Validation

CHUNK = 200  # trajectories per round trip while exporting (their steps are fetched in one query)
ROOT = "flywheel/stores"


def store_dir(kind: str) -> str:
    return f"{ROOT}/{kind}"


@functools.cache
def code_version() -> str:
    """The git commit of the running code, or "unknown" outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def step_message(thought: str, action_text: str, mapping: ScreenMapping) -> str:
    """A stored step (screen pixels) as the model's answer in its own frame: `Thought: … Action: …`."""
    actions = map_points(parse_actions(action_text), mapping.to_model)
    return format_step(ParsedStep(thought=thought, actions=actions))


def observation(image: str, outline: list[dict[str, Any]] | None, mapping: ScreenMapping) -> list[dict[str, Any]]:
    """A step's observation as the model read it: the screenshot, then the page's outline (browser steps) in the
    model's frame, exactly as SandboxEnv and the live proposals write it (sandbox/outline.py)."""
    content: list[dict[str, Any]] = [{"type": "image", "image": image}]
    if outline is not None:
        try:
            text = render_outline(parse_outline({"elements": outline}), mapping.scale)
        except ValueError:
            text = "Interactive elements: unavailable."
        content.append({"type": "text", "text": text})
    return content


def model_image(data: bytes, name: str, mapping: ScreenMapping) -> tuple[bytes, str]:
    """The screenshot as the model sees it, and its file extension: in the absolute frame resized to the model
    image's size when it differs (PNG), in the relative frame as stored."""
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else "png"
    if mapping.mode != CoordinateMode.ABSOLUTE:
        return data, ext
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if image.size == mapping.model_size:
            return data, ext
        resized = image.convert("RGB").resize(mapping.model_size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    resized.save(out, format="PNG")
    return out.getvalue(), "png"


def _replace(name: str, content: File) -> str:
    """Save under exactly `name` (a re-run after a crash overwrites what the interrupted one left)."""
    if default_storage.exists(name):
        default_storage.delete(name)
    saved = default_storage.save(name, content)
    if saved != name:
        raise RuntimeError(f"storage saved {name!r} as {saved!r}")
    return saved


def _publish(local: str, name: str) -> None:
    """Put a finished local file into storage under exactly `name`: moved (a rename when on the same filesystem, no
    second copy of a large Parquet file) for filesystem storage, else uploaded."""
    try:
        target = default_storage.path(name)
    except NotImplementedError:  # remote storage (S3): upload it
        with open(local, "rb") as handle:
            _replace(name, File(handle))
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(local, target)
    os.chmod(target, settings.FILE_UPLOAD_PERMISSIONS or 0o644)


def _sha256_file(path: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _chunks(queryset: Any, chunk: int) -> Iterator[list[int]]:
    """Trajectory ids of `queryset` (of Validation) in ascending chunks, by keyset: constant memory."""
    after = 0
    while ids := list(
        queryset.filter(trajectory_id__gt=after)
        .order_by("trajectory_id")
        .values_list("trajectory_id", flat=True)[:chunk]
    ):
        yield ids
        after = ids[-1]


def new_rows(iteration: Iteration, kind: str) -> Any:
    """This iteration's validations routed to `kind` whose trajectory no earlier version of that store holds."""
    earlier = Validation.objects.filter(
        trajectory=OuterRef("trajectory"), route=kind, iteration__dataset_versions__kind=kind
    ).exclude(iteration=iteration)
    return Validation.objects.filter(iteration=iteration, route=kind).filter(~Exists(earlier))


def episodes_for(
    ids: list[int], kind: str, version: int, iteration: Iteration, coordinates: str, images: Callable[..., str]
) -> Iterator[tuple[Episode, dict[str, Any]]]:
    """Episodes of the trajectories `ids` (one query for them, one for their steps); `images(trajectory, step,
    name, mapping)` stores a screenshot and returns its path relative to the episode file."""
    rows = {
        row[0]: row
        for row in Trajectory.objects.filter(pk__in=ids).values_list(
            "pk",
            "mode",
            "task_id",
            "task__instruction",
            "task__domain",
            "screen_width",
            "screen_height",
            "outcome_reward",
            "annotator_id",
        )
    }
    verdicts = dict(
        Validation.objects.filter(iteration=iteration, trajectory_id__in=ids).values_list("trajectory_id", "v")
    )
    steps: dict[int, list[tuple[Any, ...]]] = {}
    for row in (
        Step.objects.filter(trajectory_id__in=ids)
        .exclude(status=Step.Status.CUT)  # a reviewer cut them (annotation_app.step_edits): kept, never exported
        .order_by("trajectory_id", "index")
        .values_list("trajectory_id", "index", "thought", "action_text", "screenshot", "outline")
    ):
        steps.setdefault(row[0], []).append(row)
    mode = CoordinateMode(coordinates)
    for pk in ids:
        _, traj_mode, task_id, instruction, domain, width, height, reward, annotator = rows[pk]
        mapping = ScreenMapping(width, height, mode)
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": COMPUTER_USE.format(language="English", instruction=instruction)}
        ]
        for _, index, thought, action_text, screenshot, outline in steps.get(pk, []):
            path = images(pk, index, screenshot, mapping)
            messages.append({"role": "user", "content": observation(path, outline, mapping)})
            messages.append({"role": "assistant", "content": step_message(thought, action_text, mapping)})
        model_w, model_h = mapping.model_size
        episode = Episode(
            messages=messages,
            id=f"trajectory-{pk}",
            reward=reward,
            source=traj_mode,
            instruction=instruction,
            meta={
                "trajectory_id": pk,
                "task_id": task_id,
                "domain": domain,
                "store": kind,
                "dataset_version": version,
                "iteration": iteration.pk,
                "v": verdicts.get(pk),
                "screen": [width, height],
                "model_frame": [model_w, model_h],
                "coordinates": coordinates,
            },
        )
        yield (
            episode,
            {
                "mode": traj_mode,
                "domain": domain or "—",
                "source": "human" if annotator else "model",
                "indexes": [row[1] for row in steps.get(pk, [])],
            },
        )


def transcripts_for(ids: list[int]) -> dict[int, list[Any]]:
    """The in-situ captures' alignment of the trajectories `ids` that have one (one query): per step index, the raw
    transcript text and its timed words."""
    return {
        pk: alignment
        for pk, alignment in Capture.objects.filter(trajectory_id__in=ids).values_list("trajectory_id", "alignment")
        if alignment
    }


def step_transcripts(alignment: list[Any], indexes: list[int]) -> list[StepTranscript]:
    """A capture's alignment as transcripts of the episode's steps (`step` is the position in the episode; the
    alignment is by Step.index), leaving out steps nothing was said in."""
    out = []
    for position, index in enumerate(indexes):
        aligned = alignment[index] if 0 <= index < len(alignment) and isinstance(alignment[index], dict) else {}
        words = [w for w in aligned.get("words") or [] if isinstance(w, dict)]
        text = aligned.get("raw") or " ".join(str(w.get("text", "")).strip() for w in words).strip()
        if text or words:
            out.append(StepTranscript(step=position, text=text, words=words))
    return out


def export_store(
    iteration: Iteration,
    kind: str,
    *,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
    parquet_images: str = "bytes",
) -> DatasetVersion | None:
    """Make the next version of the `kind` store with this iteration's new rows for it (None when it has none), in
    every format at once. Idempotent: the version this iteration made is returned as it is (nothing rewritten).
    Holds a lock per store while it writes."""

    if parquet_images not in formats.PARQUET_IMAGES:
        raise ValueError(f"parquet_images must be one of {', '.join(formats.PARQUET_IMAGES)}")
    with advisory_lock(f"flywheel.store.{kind}") as mine:
        if not mine:
            raise RuntimeError(f"another export is writing the {kind} store; try again when it is done")
        existing = DatasetVersion.objects.filter(iteration=iteration, kind=kind).first()
        if existing is not None:
            return existing
        rows = new_rows(iteration, kind)
        added = rows.count()
        if not added:
            return None
        parent = DatasetVersion.objects.filter(kind=kind).order_by("-number").first()
        number = parent.number + 1 if parent else 1
        coordinates = iteration.config.get("export", {}).get("coordinates", "absolute")
        base = store_dir(kind)
        tag = f"v{number:04d}"
        counts: dict[str, Counter[str]] = {"by_mode": Counter(), "by_domain": Counter(), "by_source": Counter()}
        image_count = 0
        with tempfile.TemporaryDirectory(prefix="flywheel-export-") as tmp:
            episodes_path, rows_path, sums_path = (os.path.join(tmp, n) for n in ("episodes", "rows", "sums"))
            others = formats.writers(kind, Path(tmp), tag, parquet_images=parquet_images)
            written: list[tuple[str, bytes]] = []  # the current episode's images, for the formats that embed them
            try:
                with (
                    open(episodes_path, "w", encoding="utf-8") as episodes_out,
                    open(rows_path, "w", encoding="utf-8") as rows_out,
                    open(sums_path, "w", encoding="utf-8") as sums_out,
                ):

                    def images(trajectory: int, index: int, name: str, mapping: ScreenMapping) -> str:
                        nonlocal image_count
                        with default_storage.open(name, "rb") as handle:
                            data, ext = model_image(handle.read(), name, mapping)
                        relative = f"images/t{trajectory}/{index:05d}.{ext}"
                        _replace(f"{base}/{relative}", ContentFile(data))
                        sums_out.write(f"{hashlib.sha256(data).hexdigest()}  {relative}\n")
                        image_count += 1
                        written.append((relative, data))
                        return relative

                    done = 0
                    for ids in _chunks(rows, chunk):
                        spoken = transcripts_for(ids) if kind == Route.CT else {}
                        for episode, labels in episodes_for(ids, kind, number, iteration, coordinates, images):
                            pk = episode.meta["trajectory_id"]
                            episodes_out.write(episode.to_json() + "\n")
                            rows_out.write(f"{pk}\n")
                            record = Record(
                                episode, list(written), step_transcripts(spoken.get(pk, []), labels["indexes"])
                            )
                            written.clear()
                            for writer in others:
                                writer.add(record)
                            for key, value in (("by_mode", "mode"), ("by_domain", "domain"), ("by_source", "source")):
                                counts[key][labels[value]] += 1
                        done += len(ids)
                        if progress:
                            progress(done)
            finally:
                for writer in others:
                    writer.close()
            files = []
            for role, local, name in (
                ("episodes", episodes_path, f"episodes-{tag}.jsonl"),
                ("rows", rows_path, f"rows-{tag}.txt"),
                ("checksums", sums_path, f"checksums-{tag}.sha256"),
                *((w.role, str(w.path), f"{formats.SUBDIR}/{w.path.name}") for w in others),
            ):
                sha, size = _sha256_file(local)
                _publish(local, f"{base}/{name}")
                files.append({"path": name, "role": role, "sha256": sha, "bytes": size, "version": number})
        parent_counts = parent.manifest.get("counts", {}).get("total", {}) if parent else {}
        total_counts = {key: dict(Counter(parent_counts.get(key, {})) + counter) for key, counter in counts.items()}
        manifest = {
            "format": "training.data episodes (JSON Lines), images relative to the episodes file",
            "formats": formats.describe(kind, tag, parquet_images),
            "kind": kind,
            "version": number,
            "parent": parent.number if parent else None,
            "iteration": iteration.pk,
            "code_version": code_version(),
            "created_at": timezone.now().isoformat(),
            "root": base,
            "coordinates": coordinates,
            "rows": {
                "total": (parent.row_count if parent else 0) + added,
                "added": added,
                "added_file": f"rows-{tag}.txt",
                "parent_files": [
                    f["path"] for f in (parent.manifest.get("files", []) if parent else []) if f["role"] == "rows"
                ],
            },
            "counts": {"added": {k: dict(v) for k, v in counts.items()}, "total": total_counts},
            "images": {"added": image_count, "checksums": f"checksums-{tag}.sha256"},
            "files": (parent.manifest.get("files", []) if parent else []) + files,
        }
        with transaction.atomic():
            return DatasetVersion.objects.create(
                kind=kind,
                number=number,
                parent=parent,
                iteration=iteration,
                manifest=manifest,
                row_count=manifest["rows"]["total"],
                added_count=added,
            )


def export_iteration(iteration: Iteration, *, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The export stage: a new SFT and a new CT version with the rows this iteration routed there."""
    totals = {kind: new_rows(iteration, kind).count() for kind in (Route.SFT, Route.CT)}
    total = sum(totals.values())
    output: dict[str, Any] = {}
    finished = 0
    for kind in (Route.SFT, Route.CT):

        def report(done: int, before: int = finished) -> None:
            if progress:
                progress(before + done, total)

        parquet_images = iteration.config.get("export", {}).get("parquet_images", "bytes")
        version = export_store(iteration, kind, progress=report, parquet_images=parquet_images)
        finished += totals[kind]
        output[kind] = (
            {"version": version.number, "id": version.pk, "added": version.added_count, "rows": version.row_count}
            if version
            else None
        )
    if progress:
        progress(total, total)
    return output


def version_files(version: DatasetVersion, role: str = "episodes", since_version: int | None = None) -> list[Path]:
    """Local paths of a version's files of `role` (its parents' included, or only those from `since_version` on),
    for filesystem storage: what the trainer reads (`training.data.read_episodes` on each, or on the store directory
    for the newest version)."""
    root = version.manifest["root"]
    return [
        Path(default_storage.path(f"{root}/{f['path']}"))
        for f in version.manifest["files"]
        if f["role"] == role and (since_version is None or f.get("version", version.number) >= since_version)
    ]
