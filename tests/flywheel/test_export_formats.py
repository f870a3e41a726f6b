"""The stores' other formats: Parquet read back by Hugging Face `datasets` itself, chat JSONL (TRL) and sharegpt JSONL
(LLaMA-Factory) parsed back with their images resolving, the CT corpus with the in-situ transcripts in order; every
format agrees with the episode export on coordinates, the manifest's checksums match, a re-run writes nothing."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from pathlib import Path

import pytest
from django.core.files.storage import default_storage
from PIL import Image

from annotation_app.models import Capture, Step, Task, Trajectory, User
from flywheel import formats
from flywheel.export import export_iteration, store_dir
from flywheel.iterations import run_iteration, start_iteration
from flywheel.models import DatasetVersion, Iteration
from sandbox.actions import parse_step
from sandbox.coordinates import CoordinateMode, ScreenMapping
from training.data import read_episodes

from .helpers import png

pytestmark = pytest.mark.django_db

SCREEN = (1920, 1080)
ACTIONS = [
    "click(start_box='<|box_start|>(960,540)<|box_end|>')",
    "drag(start_box='<|box_start|>(10,20)<|box_end|>', end_box='<|box_start|>(1900,1000)<|box_end|>')",
    "type(content='hello')",
]
SPOKEN = ["first I open the menu", "", "then I type hello"]  # nothing said during the second step


def _trajectory(mode: str, reward: float, annotator: User | None = None) -> Trajectory:
    task = Task.objects.create(instruction=f"Do the {mode} thing", domain="chrome")
    trajectory = Trajectory.objects.create(
        task=task,
        mode=mode,
        status=Trajectory.Status.SUBMITTED,
        outcome_reward=reward,
        annotator=annotator,
        screen_width=SCREEN[0],
        screen_height=SCREEN[1],
    )
    for i, action in enumerate(ACTIONS):
        colour = (20 * i, 100, 200)
        name = default_storage.save(f"t/{trajectory.pk}/{i}.png", io.BytesIO(png(*SCREEN, colour)))
        Step.objects.create(trajectory=trajectory, index=i, thought=f"Step {i}.", action_text=action, screenshot=name)
    return trajectory


def _in_situ(annotator: User) -> Trajectory:
    """An in-situ trajectory (CT material) whose capture aligned words to its steps."""
    trajectory = _trajectory(Trajectory.Mode.IN_SITU, 1.0, annotator)
    alignment = []
    clock = 0.0
    for text in SPOKEN:
        words = []
        for word in text.split():
            words.append({"text": word, "start": round(clock, 3), "end": round(clock + 0.3, 3)})
            clock += 0.4
        alignment.append({"words": words, "raw": text, "refined": None})
    Capture.objects.create(
        annotator=annotator,
        session_id=uuid.uuid4(),
        size=1,
        sha256="0" * 64,
        trajectory=trajectory,
        status=Capture.Status.SUBMITTED,
        alignment=alignment,
    )
    return trajectory


def _run(**config: object) -> Iteration:
    iteration = start_iteration(None, enqueue=False, config={"v": {"threshold": 0.5}, **config})
    done = run_iteration(iteration.pk)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    return done


def _path(kind: str, name: str) -> Path:
    return Path(default_storage.path(f"{store_dir(kind)}/{name}"))


def _file(version: DatasetVersion, role: str) -> Path:
    (entry,) = [f for f in version.manifest["files"] if f["role"] == role and f["version"] == version.number]
    return _path(version.kind, entry["path"])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _points(text: str) -> list[tuple[int, int]]:
    """Every point of a `Thought/Action` answer, in the frame it was written in."""
    out = []
    for action in parse_step(text).actions:
        for value in vars(action).values():
            if hasattr(value, "x") and hasattr(value, "y"):
                out.append((value.x, value.y))
    return out


def _answers(messages: list[dict]) -> list[str]:
    texts = []
    for m in messages:
        if m["role"] != "assistant":
            continue
        content = m["content"]
        texts.append(content if isinstance(content, str) else "".join(p["text"] for p in content))
    return texts


@pytest.fixture
def stores(media, make_user):
    """One SFT (a successful rollout) and one CT (an in-situ capture) trajectory, exported."""
    sft = _trajectory(Trajectory.Mode.ROLLOUT, 1.0)
    ct = _in_situ(make_user("annotator"))
    return sft, ct


def test_parquet_loads_with_datasets_and_its_images_decode(stores):
    import datasets

    sft, ct = stores
    _run()
    for kind, trajectory in (("sft", sft), ("ct", ct)):
        version = DatasetVersion.objects.get(kind=kind)
        (episode,) = read_episodes(_file(version, "episodes"))
        loaded = datasets.load_dataset("parquet", data_files=str(_file(version, "parquet")), split="train")
        assert len(loaded) == 1
        row = loaded[0]
        assert row["id"] == episode.id and row["trajectory_id"] == trajectory.pk and row["reward"] == 1.0
        assert len(row["images"]) == len(ACTIONS)
        model_size = ScreenMapping(*SCREEN).model_size
        episode_dir = _file(version, "episodes").parent
        episode_images = formats.image_paths(episode, prefix="")
        for picture, path in zip(row["images"], episode_images, strict=True):
            assert isinstance(picture, Image.Image) and picture.size == model_size
            with Image.open(episode_dir / path) as written:  # the same pixels as the episode's screenshot
                assert picture.convert("RGB").tobytes() == written.convert("RGB").tobytes()
        placeholders = sum(p["type"] == "image" for m in row["messages"] for p in m["content"])
        assert placeholders == len(row["images"])
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * len(ACTIONS)
        assert _answers(row["messages"]) == _answers(episode.messages)
        assert json.loads(row["meta"])["trajectory_id"] == trajectory.pk


def test_parquet_row_groups_and_images_as_paths(media, monkeypatch):
    import datasets
    import pyarrow.parquet as pq

    trajectories = [_trajectory(Trajectory.Mode.ROLLOUT, 1.0) for _ in range(5)]
    monkeypatch.setattr(formats, "ROW_GROUP_ROWS", 2)
    _run(export={"coordinates": "absolute"})
    version = DatasetVersion.objects.get(kind="sft")
    assert pq.ParquetFile(_file(version, "parquet")).metadata.num_row_groups == 3  # 2 + 2 + 1: streamed
    loaded = datasets.load_dataset("parquet", data_files=str(_file(version, "parquet")), split="train")
    assert sorted(loaded["trajectory_id"]) == sorted(t.pk for t in trajectories)

    # Images as paths: a second store version written by export_store with the option.
    from flywheel.export import export_store

    more = _trajectory(Trajectory.Mode.ROLLOUT, 1.0)
    iteration = start_iteration(None, enqueue=False, config={"v": {"threshold": 0.5}}, stages=["validate"])
    run_iteration(iteration.pk)
    second = export_store(Iteration.objects.get(pk=iteration.pk), "sft", parquet_images="paths")
    assert second.manifest["formats"]["parquet"]["images"] == "paths"
    parquet = _file(second, "parquet")
    (row,) = datasets.load_dataset("parquet", data_files=str(parquet), split="train")
    assert row["trajectory_id"] == more.pk and len(row["images"]) == len(ACTIONS)
    for path in row["images"]:
        assert isinstance(path, str) and (parquet.parent / path).is_file()
    with pytest.raises(ValueError, match="parquet_images must be one of"):
        export_store(iteration, "sft", parquet_images="base64")


def test_chat_and_sharegpt_jsonl_parse_back_and_their_images_resolve(stores):
    _run()
    for kind in ("sft", "ct"):
        version = DatasetVersion.objects.get(kind=kind)
        (episode,) = read_episodes(_file(version, "episodes"))
        chat_file, sharegpt_file = _file(version, "chat"), _file(version, "sharegpt")
        (chat,) = _lines(chat_file)
        (sharegpt,) = _lines(sharegpt_file)
        for row, path in ((chat, chat_file), (sharegpt, sharegpt_file)):
            assert row["id"] == episode.id and len(row["images"]) == len(ACTIONS)
            for image in row["images"]:
                assert (path.parent / image).resolve() == (Path(episode.meta["base_dir"]) / image[3:]).resolve()
                assert (path.parent / image).is_file()
            roles = [m["role"] for m in row["messages"]]
            assert roles == ["user", "assistant"] * len(ACTIONS)  # alternating, as sharegpt requires
        # TRL: typed parts, one unfilled image placeholder per image, in order.
        parts = [p for m in chat["messages"] for p in m["content"]]
        assert all(isinstance(m["content"], list) for m in chat["messages"])
        assert sum(p["type"] == "image" and "image" not in p for p in parts) == len(chat["images"])
        assert chat["messages"][0]["content"][0]["type"] == "text"
        assert episode.instruction in chat["messages"][0]["content"][0]["text"]
        # LLaMA-Factory: string contents, as many <image> markers as images.
        assert all(isinstance(m["content"], str) for m in sharegpt["messages"])
        assert sum(m["content"].count("<image>") for m in sharegpt["messages"]) == len(sharegpt["images"])
        assert _answers(chat["messages"]) == _answers(sharegpt["messages"]) == _answers(episode.messages)
        info = version.manifest["formats"]["sharegpt"]["dataset_info"]
        assert info["formatting"] == "sharegpt" and info["file_name"] == sharegpt_file.name


def test_the_ct_corpus_interleaves_images_and_the_transcripts_in_order(stores):
    _, ct = stores
    _run()
    version = DatasetVersion.objects.get(kind="ct")
    assert "corpus" in version.manifest["formats"]
    assert "corpus" not in DatasetVersion.objects.get(kind="sft").manifest["formats"]
    corpus_file = _file(version, "corpus")
    (doc,) = _lines(corpus_file)
    assert doc["trajectory_id"] == ct.pk
    assert len(doc["texts"]) == len(doc["images"])
    assert all((t is None) != (i is None) for t, i in zip(doc["texts"], doc["images"], strict=True))
    assert doc["texts"][0] == ct.task.instruction
    images = [i for i in doc["images"] if i is not None]
    assert len(images) == len(ACTIONS) and all((corpus_file.parent / i).is_file() for i in images)
    # What was said comes in step order, each after its step's screenshot and before its action.
    said = [text for text in SPOKEN if text]
    positions = [doc["texts"].index(text) for text in said]
    assert positions == sorted(positions)
    image_at = [n for n, i in enumerate(doc["images"]) if i is not None]
    assert image_at[0] < positions[0] < image_at[1] and image_at[2] < positions[1]
    assert [t["step"] for t in doc["transcripts"]] == [0, 2]
    assert [t["text"] for t in doc["transcripts"]] == said
    assert [w["text"] for w in doc["transcripts"][1]["words"]] == SPOKEN[2].split()
    starts = [w["start"] for t in doc["transcripts"] for w in t["words"]]
    assert starts == sorted(starts)


@pytest.mark.parametrize("coordinates", ["absolute", "relative1000"])
def test_every_format_has_the_episode_export_coordinates(stores, coordinates):
    import datasets

    _run(export={"coordinates": coordinates})
    mapping = ScreenMapping(*SCREEN, CoordinateMode(coordinates))
    expected = [[mapping.to_model(*p) for p in _points(f"Thought: x\nAction: {a}")] for a in ACTIONS]
    for kind in ("sft", "ct"):
        version = DatasetVersion.objects.get(kind=kind)
        assert version.manifest["coordinates"] == coordinates
        (episode,) = read_episodes(_file(version, "episodes"))
        answers = {
            "episodes": _answers(episode.messages),
            "chat": _answers(_lines(_file(version, "chat"))[0]["messages"]),
            "sharegpt": _answers(_lines(_file(version, "sharegpt"))[0]["messages"]),
            "parquet": _answers(
                datasets.load_dataset("parquet", data_files=str(_file(version, "parquet")), split="train")[0][
                    "messages"
                ]
            ),
        }
        if kind == "ct":
            texts = _lines(_file(version, "corpus"))[0]["texts"]
            answers["corpus"] = [t for t in texts if t and t.startswith("Thought:")]
        for name, texts in answers.items():
            assert [_points(t) for t in texts] == expected, name
            assert texts == answers["episodes"], name


def test_manifest_checksums_match_and_a_rerun_writes_nothing(stores):
    iteration = _run()
    for version in DatasetVersion.objects.all():
        roles = {f["role"] for f in version.manifest["files"]}
        expected = {"episodes", "rows", "checksums", "parquet", "chat", "sharegpt"}
        assert roles == (expected | {"corpus"} if version.kind == "ct" else expected)
        for entry in version.manifest["files"]:
            data = _path(version.kind, entry["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        for name in version.manifest["formats"].values():
            assert _path(version.kind, name["file"]).is_file()
    root = Path(default_storage.path("flywheel/stores"))

    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_mtime_ns, p.stat().st_ino) for p in root.rglob("*") if p.is_file()}

    before = snapshot()
    versions = list(DatasetVersion.objects.order_by("pk").values_list("pk", "manifest"))
    output = export_iteration(Iteration.objects.get(pk=iteration.pk))
    assert {output[k]["version"] for k in ("sft", "ct")} == {1}
    assert snapshot() == before  # no file written again, none added
    assert list(DatasetVersion.objects.order_by("pk").values_list("pk", "manifest")) == versions


def test_a_new_version_adds_its_own_format_files_and_references_its_parents(stores):
    _run()
    v1 = DatasetVersion.objects.get(kind="sft")
    old = {f["path"]: _path("sft", f["path"]).stat().st_mtime_ns for f in v1.manifest["files"]}
    newer = _trajectory(Trajectory.Mode.ROLLOUT, 1.0)
    _run()
    v2 = DatasetVersion.objects.get(kind="sft", number=2)
    assert [f for f in v2.manifest["files"] if f["version"] == 1] == v1.manifest["files"]
    assert {f["path"]: _path("sft", f["path"]).stat().st_mtime_ns for f in v1.manifest["files"]} == old
    (row,) = _lines(_file(v2, "chat"))
    assert row["trajectory_id"] == newer.pk
    assert v2.manifest["formats"]["parquet"]["file"] == "formats/data-v0002.parquet"


def test_the_stores_page_links_and_serves_the_format_files(stores, make_user):
    from django.test import Client
    from django.urls import reverse

    _run()
    version = DatasetVersion.objects.get(kind="ct")
    client = Client()
    client.force_login(make_user("data_lead"))
    page = client.get(reverse("flywheel-stores")).content.decode()
    for role in ("parquet", "chat", "sharegpt", "corpus"):
        (entry,) = [f for f in version.manifest["files"] if f["role"] == role]
        url = reverse("flywheel-dataset-file", args=[version.pk, entry["path"]])
        assert url in page
        body = b"".join(client.get(url).streaming_content)
        assert hashlib.sha256(body).hexdigest() == entry["sha256"]
    assert client.get(reverse("flywheel-dataset-file", args=[version.pk, "formats/other.jsonl"])).status_code == 404


def test_the_stores_page_counts_the_files_earlier_versions_hold():
    """A version lists its parents' files by reference; the page counts them whatever the number of formats."""
    from types import SimpleNamespace

    from flywheel.templatetags.flywheel_tags import earlier_files

    files = [{"version": 1}] * 7 + [{"version": 2}] * 7
    assert earlier_files(SimpleNamespace(number=2, manifest={"files": files})) == 7
    assert earlier_files(SimpleNamespace(number=1, manifest={})) == 0
