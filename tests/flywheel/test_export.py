"""The exporter: store versions in the trainer's episode format, read back by training.data with no conversion;
coordinates in the model's frame through sandbox.coordinates; immutable versions that reference their parent."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from django.core.files.storage import default_storage
from PIL import Image

from annotation_app.models import Step, Task, Trajectory
from flywheel.export import store_dir, version_files
from flywheel.iterations import IterationError, run_iteration, start_iteration
from flywheel.models import DatasetVersion, Iteration, Route, Validation
from sandbox.actions import parse_step
from sandbox.coordinates import CoordinateMode, ScreenMapping
from training.data import read_episodes, validate

from .helpers import png, population

pytestmark = pytest.mark.django_db


def _run(**kwargs: object) -> Iteration:
    iteration = start_iteration(None, enqueue=False, **kwargs)  # type: ignore[arg-type]
    done = run_iteration(iteration.pk, chunk=7)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    return done


def _store(kind: str) -> Path:
    return Path(default_storage.path(store_dir(kind)))


def test_export_writes_episodes_the_trainer_reads_as_they_are(media, make_user):
    rng = random.Random(11)
    pop = population(rng, 25, steps=(1, 4), screenshots=png(1280, 800), reviewer=make_user("data_lead"))
    iteration = _run()
    routes = dict(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", "route"))
    for kind in (Route.SFT, Route.CT):
        expected = {pk for pk, route in routes.items() if route == kind}
        version = DatasetVersion.objects.filter(kind=kind).first()
        if not expected:
            assert version is None
            continue
        assert version.number == 1 and version.parent is None and version.iteration == iteration
        episodes = list(read_episodes(_store(kind)))  # the store directory, as the trainer is given it
        assert {e.meta["trajectory_id"] for e in episodes} == expected
        assert version.row_count == version.added_count == len(expected)
        assert sum(version.manifest["counts"]["added"]["by_mode"].values()) == len(expected)
        for episode in episodes:
            trajectory = Trajectory.objects.get(pk=episode.meta["trajectory_id"])
            steps = list(trajectory.steps.order_by("index"))
            assert episode.turns == len(steps)
            assert episode.source == trajectory.mode and episode.reward == trajectory.outcome_reward
            assert (
                episode.messages[0]["role"] == "user" and trajectory.task.instruction in episode.messages[0]["content"]
            )
            images = [p["image"] for m in episode.messages if isinstance(m["content"], list) for p in m["content"]]
            assert len(images) == len(steps)
            model_w, model_h = ScreenMapping(1280, 800).model_size
            for image in images:
                with Image.open(Path(episode.meta["base_dir"]) / image) as picture:
                    assert picture.size == (model_w, model_h)  # the picture and the coordinates agree
            validate({k: v for k, v in episode.__dict__.items()}, "roundtrip")
        # Every file the manifest lists exists with its SHA-256.
        for entry in version.manifest["files"]:
            data = default_storage.open(f"{store_dir(kind)}/{entry['path']}").read()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        sums = default_storage.open(f"{store_dir(kind)}/{version.manifest['images']['checksums']}").read().decode()
        for line in sums.splitlines():
            sha, path = line.split("  ")
            assert hashlib.sha256(default_storage.open(f"{store_dir(kind)}/{path}").read()).hexdigest() == sha
    assert pop.in_scope == set(routes)


def _one(screen: tuple[int, int], action: str, **kwargs: object) -> Trajectory:
    task = Task.objects.create(instruction="Press the button", domain="chrome")
    trajectory = Trajectory.objects.create(
        task=task,
        mode=Trajectory.Mode.ROLLOUT,
        status=Trajectory.Status.SUBMITTED,
        outcome_reward=1.0,
        screen_width=screen[0],
        screen_height=screen[1],
        **kwargs,
    )
    name = default_storage.save(f"t/{trajectory.pk}.png", __import__("io").BytesIO(png(*screen)))
    Step.objects.create(trajectory=trajectory, index=0, thought="The button.", action_text=action, screenshot=name)
    return trajectory


@pytest.mark.parametrize(
    ("coordinates", "expected"),
    [("absolute", "click(start_box='<|box_start|>(966,546)<|box_end|>')"), ("relative1000", None)],
)
def test_coordinates_are_converted_to_the_model_frame(media, coordinates, expected):
    trajectory = _one((1920, 1080), "click(start_box='<|box_start|>(960,540)<|box_end|>')")
    _run(config={"export": {"coordinates": coordinates}, "v": {"threshold": 0.5}})
    (episode,) = read_episodes(_store("sft"))
    mapping = ScreenMapping(1920, 1080, CoordinateMode(coordinates))
    (action,) = parse_step(episode.messages[-1]["content"]).actions
    assert (action.point.x, action.point.y) == mapping.to_model(960, 540)
    if expected:  # 1920x1080 is 1932x1092 for Qwen2.5-VL: the centre is (966, 546) there
        assert episode.messages[-1]["content"] == f"Thought: The button.\nAction: {expected}"
    else:
        assert (action.point.x, action.point.y) == (500, 500)
    assert episode.meta["trajectory_id"] == trajectory.pk and episode.meta["coordinates"] == coordinates


@pytest.mark.parametrize(("coordinates", "centre"), [("absolute", "(966,546)"), ("relative1000", "(500,500)")])
def test_a_browser_step_is_exported_with_the_page_outline_it_was_taken_on(media, coordinates, centre):
    """The model read the page's outline beside the screenshot: the episode shows it the same text, its centres in
    the store's frame (sandbox/outline.py); a step without one stays a bare screenshot."""
    button = {"role": "button", "text": "Play", "value": None, "checked": None, "focused": False,
              "x": 900.0, "y": 520.0, "w": 120.0, "h": 40.0}  # fmt: skip
    trajectory = _one((1920, 1080), "click(start_box='(960,540)')")
    Step.objects.filter(trajectory=trajectory).update(outline=[button])
    _one((1920, 1080), "click(start_box='(10,10)')")  # a desktop step: no outline
    _run(config={"export": {"coordinates": coordinates}, "v": {"threshold": 0.5}})
    browser, desktop = sorted(read_episodes(_store("sft")), key=lambda e: e.meta["trajectory_id"])
    image, text = browser.messages[1]["content"]
    assert image["type"] == "image" and text["type"] == "text"
    assert text["text"] == f'Interactive elements (role, label, state, centre):\nbutton "Play" {centre}'
    assert [part["type"] for part in desktop.messages[1]["content"]] == ["image"]


def test_a_new_version_references_its_parent_without_copying_it(media):
    _one((1280, 800), "click(start_box='(1,2)')")
    first = _run()
    v1 = DatasetVersion.objects.get(kind="sft")
    second_trajectory = _one((1280, 800), "click(start_box='(3,4)')")
    _run()
    v2 = DatasetVersion.objects.get(kind="sft", number=2)
    assert v2.parent == v1 and v2.row_count == 2 and v2.added_count == 1
    assert v1.iteration == first
    parents = [f for f in v2.manifest["files"] if f["version"] == 1]
    assert parents == v1.manifest["files"]  # by reference: same names, same checksums
    assert sorted(p.name for p in _store("sft").glob("episodes-*.jsonl")) == [
        "episodes-v0001.jsonl",
        "episodes-v0002.jsonl",
    ]
    added = [e.meta["trajectory_id"] for e in read_episodes(version_files(v2)[-1])]
    assert added == [second_trajectory.pk]
    every = [e.meta["trajectory_id"] for path in version_files(v2) for e in read_episodes(path)]
    assert len(every) == v2.row_count == len(set(every))
    assert v2.manifest["counts"]["total"]["by_domain"] == {"chrome": 2}
    assert v1.manifest["rows"]["total"] == 1  # the parent is unchanged


def test_export_is_idempotent_and_an_empty_route_makes_no_version(media):
    _one((1280, 800), "click(start_box='(1,2)')")
    iteration = _run()
    from flywheel.export import export_iteration

    again = export_iteration(iteration)
    assert again["sft"]["version"] == 1 and again["ct"] is None
    assert DatasetVersion.objects.count() == 1
    assert len(list(_store("sft").glob("episodes-*.jsonl"))) == 1


def test_the_store_frame_is_kept_across_versions(media):
    _one((1280, 800), "click(start_box='(1,2)')")
    _run(config={"export": {"coordinates": "relative1000"}})
    with pytest.raises(IterationError, match="store is in relative1000 coordinates"):
        start_iteration(None, enqueue=False, config={"export": {"coordinates": "absolute"}})


def test_the_trainer_renders_an_exported_store_with_its_images(media, tmp_path):
    """The SFT trainer's own reader and renderer (tiny Qwen2.5-VL built from a config) take the store as written:
    one loss-masked turn per step, one image per step."""
    from training.data import Renderer, collate
    from training.models import load_tokenizer
    from training.policy.tiny import build_tiny_checkpoint

    for action in ("click(start_box='(10,20)')", "type(content='hi')"):
        _one((280, 224), action)
    _run(config={"v": {"threshold": 0.5}})
    tokenizer, processor = load_tokenizer(build_tiny_checkpoint(tmp_path / "tiny"))
    episodes = list(read_episodes(_store("sft")))
    assert len(episodes) == 2
    renderer = Renderer(tokenizer, image_processor=processor)
    samples = [renderer.render(e) for e in episodes]
    for sample, episode in zip(samples, episodes, strict=True):
        assert len(sample.turn_ends) == episode.turns == 1
        assert sample.image_grid_thw is not None and sample.image_grid_thw.shape[0] == 1
        assert sample.loss_mask.sum() > 0 and float(sample.rewards.sum()) == 1.0  # the outcome on the last turn
    assert collate(samples, tokenizer.pad_token_id)["pixel_values"].shape[0] > 0


def test_the_stores_page_lists_versions_with_counts_and_downloads(media, make_user):
    from django.test import Client
    from django.urls import reverse

    _one((1280, 800), "click(start_box='(1,2)')")
    _run()
    version = DatasetVersion.objects.get()
    client = Client()
    client.force_login(make_user("data_lead"))
    page = client.get(reverse("flywheel-stores")).content.decode()
    assert "SFT" in page and "rollout: 1" in page and "chrome: 1" in page and "model: 1" in page
    url = reverse("flywheel-dataset-file", args=[version.pk, "episodes-v0001.jsonl"])
    assert url in page
    body = b"".join(client.get(url).streaming_content)
    assert hashlib.sha256(body).hexdigest() == version.manifest["files"][0]["sha256"]


def test_a_stage_that_fails_records_the_error_and_a_resume_finishes_it(media):
    trajectory = _one((1280, 800), "click(start_box='(1,2)')")
    step = trajectory.steps.get()
    data = default_storage.open(step.screenshot.name).read()
    default_storage.delete(step.screenshot.name)  # the row names a screenshot the storage lost
    iteration = start_iteration(None, enqueue=False)
    failed = run_iteration(iteration.pk)
    assert failed.status == Iteration.Status.FAILED and "FileNotFoundError" in failed.error
    assert failed.stages["validate"]["status"] == "done" and failed.stages["export"]["status"] == "failed"
    assert not DatasetVersion.objects.exists()
    default_storage.save(step.screenshot.name, __import__("io").BytesIO(data))
    from django.core.management import call_command

    call_command("flywheel", "resume", str(iteration.pk), stdout=__import__("io").StringIO())
    done = Iteration.objects.get(pk=iteration.pk)
    assert done.status == Iteration.Status.SUCCEEDED and done.error == ""
    assert DatasetVersion.objects.get().added_count == 1
    assert Validation.objects.filter(iteration=iteration).count() == 1
