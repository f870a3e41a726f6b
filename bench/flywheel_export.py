"""Flywheel store export: trajectories/s and peak memory at 1k, 10k (and 100k) trajectories with screenshots.

Seeds its own database (`annotation_flywheel_export_bench`, created, migrated, filled with COPY through
bench/flywheel_validation.py's helpers, dropped at the end unless --keep) and a temporary MEDIA_ROOT with a pool of
screenshots (1288x728 PNG: the Qwen2.5-VL frame of that screen is the screen itself, so the absolute-frame export
copies them as they are). Each size's trajectories are validated and routed once (not timed), then exported by a
fresh subprocess per variant, so each one's peak memory is its own (ru_maxrss at the end minus the RSS before the
export, imports and Django set up already):

- `streamed, episodes only`: flywheel.export as it runs, with the other formats switched off (episode JSONL and
  screenshots);
- `streamed, episodes + Parquet`: the same with the Parquet writer (row groups, images as bytes);
- `streamed, every format`: what the export stage writes (episodes, Parquet, chat and sharegpt JSONL, CT corpus);
- `naive load-everything (baseline)`: every trajectory with its steps loaded through the ORM, every episode and
  screenshot built in memory, then episode JSONL and one Parquet table written at the end (same conversions and
  storage writes as the exporter).

    .venv/bin/python bench/flywheel_export.py                          # 1k and 10k, 5 steps each
    .venv/bin/python bench/flywheel_export.py --sizes 1000,10000,100000 --naive-max 10000

Goal (issue 15): peak memory flat as the store grows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flywheel_validation as fv  # bench/ is not a package: its sibling is imported by path

ROOT = fv.ROOT
BENCH_DB = "annotation_flywheel_export_bench"
SCREEN = (1288, 728)
SHOTS = 256  # distinct screenshots (fewer would let Parquet's compression find repeats real ones lack)
MB = 1 << 20
VARIANTS = {
    "episodes": "streamed, episodes only",
    "parquet": "streamed, episodes + Parquet",
    "all": "streamed, every format (the export stage)",
    "naive": "naive load-everything (baseline)",
}
SAID = "first I open the menu and then I look for the save button".split()


def bench_env(media: str) -> dict[str, str]:
    """The project's environment on the bench database, a temporary MEDIA_ROOT and the benches' Redis databases."""
    fv.BENCH_DB = BENCH_DB  # fv's create/drop/env helpers name the database by this module global
    env = fv.project_env()
    env.update(MEDIA_ROOT=media)
    for name, default in (("REDIS_DB_CELERY", "10"), ("REDIS_DB_CHANNELS", "11"), ("REDIS_DB_CACHE", "11")):
        env[name] = os.environ.get(name, default)
    return env


def screenshots(media: Path, rng: random.Random) -> list[str]:
    """A pool of desktop-like PNG screenshots (flat panels, windows and text lines) in MEDIA_ROOT."""
    from PIL import Image, ImageDraw

    names = []
    folder = media / "bench" / "shots"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(SHOTS):
        image = Image.new("RGB", SCREEN, (rng.randrange(40, 90), rng.randrange(60, 120), rng.randrange(90, 160)))
        draw = ImageDraw.Draw(image)
        draw.rectangle((0, SCREEN[1] - 32, SCREEN[0], SCREEN[1]), fill=(30, 30, 30))
        for _ in range(6):
            x, y = rng.randrange(SCREEN[0] - 400), rng.randrange(SCREEN[1] - 300)
            draw.rectangle((x, y, x + rng.randrange(200, 400), y + rng.randrange(120, 300)), fill=(240, 240, 240))
            for line in range(8):
                draw.text((x + 10, y + 10 + 14 * line), f"window {k} line {line} {rng.random():.6f}", fill=(0, 0, 0))
        image.save(folder / f"{k:03d}.png", optimize=False)
        names.append(f"bench/shots/{k:03d}.png")
    return names


def seed(n: int, steps: int, domain: str, shots: list[str], rng: random.Random) -> None:
    """`n` submitted trajectories of `steps` steps in task domain `domain`; in-situ ones with a capture whose
    alignment gives words to each step (the CT corpus's transcripts)."""
    from datetime import UTC, datetime

    from django.db import connection

    from annotation_app.models import Capture, Step, Task, Trajectory, User

    annotator, _ = User.objects.get_or_create(username="flywheel-export-bench")
    tasks = Task.objects.bulk_create([Task(instruction=f"Task {i} in {domain}", domain=domain) for i in range(50)])
    now = datetime.now(UTC)
    start_id = Trajectory.objects.order_by("-id").values_list("id", flat=True).first() or 0
    fv.copy_rows(
        Trajectory,
        (
            {
                "task_id": rng.choice(tasks).pk,
                "annotator_id": annotator.pk,
                "mode": rng.choice(["interactive", "in_situ", "rollout"]),
                "status": "submitted",
                "outcome_reward": rng.choice([0.0, 1.0]),
                "screen_width": SCREEN[0],
                "screen_height": SCREEN[1],
                "submitted_at": now,
            }
            for _ in range(n)
        ),
    )
    rows = list(Trajectory.objects.filter(id__gt=start_id).order_by("id").values_list("id", "mode"))

    def step_rows() -> Iterator[dict[str, Any]]:
        for pk, _ in rows:
            for i in range(steps):
                action = rng.choice(fv.ACTIONS).format(x=rng.randrange(SCREEN[0]), y=rng.randrange(SCREEN[1]))
                yield {
                    "trajectory_id": pk,
                    "index": i,
                    "screenshot": rng.choice(shots),
                    "thought": "I click the button to go on.",
                    "action_text": action,
                    "status": "done",
                }

    fv.copy_rows(Step, step_rows())

    def alignment() -> list[dict[str, Any]]:
        clock, out = 0.0, []
        for _ in range(steps):
            words = []
            for word in rng.sample(SAID, 4):
                words.append({"text": word, "start": round(clock, 3), "end": round(clock + 0.3, 3)})
                clock += 0.4
            out.append({"words": words, "raw": " ".join(w["text"] for w in words), "refined": None})
        return out

    fv.copy_rows(
        Capture,
        (
            {
                "annotator_id": annotator.pk,
                "session_id": uuid.uuid4(),
                "size": 1,
                "sha256": "0" * 64,
                "trajectory_id": pk,
                "status": "submitted",
                "alignment": alignment(),
            }
            for pk, mode in rows
            if mode == "in_situ"
        ),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def naive_export(iteration: Any) -> int:
    """The baseline: everything loaded, every episode and image built in memory, then written."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    from annotation_app.models import Trajectory
    from flywheel import formats
    from flywheel.export import _replace, model_image, step_message
    from flywheel.models import Route, Validation
    from sandbox.coordinates import CoordinateMode, ScreenMapping
    from training.data import Episode
    from training.policy.prompts import COMPUTER_USE

    routes = dict(
        Validation.objects.filter(iteration=iteration, route__in=[Route.SFT, Route.CT]).values_list(
            "trajectory_id", "route"
        )
    )
    trajectories = list(
        Trajectory.objects.filter(pk__in=list(routes)).select_related("task").prefetch_related("steps").order_by("pk")
    )
    built: dict[str, list[tuple[Episode, list[tuple[str, bytes]]]]] = {Route.SFT: [], Route.CT: []}
    for t in trajectories:
        mapping = ScreenMapping(t.screen_width, t.screen_height, CoordinateMode.ABSOLUTE)
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": COMPUTER_USE.format(language="English", instruction=t.task.instruction)}
        ]
        images = []
        for step in sorted(t.steps.all(), key=lambda s: s.index):
            with default_storage.open(step.screenshot.name, "rb") as handle:
                data, ext = model_image(handle.read(), step.screenshot.name, mapping)
            relative = f"images/t{t.pk}/{step.index:05d}.{ext}"
            images.append((relative, data))
            messages.append({"role": "user", "content": [{"type": "image", "image": relative}]})
            messages.append({"role": "assistant", "content": step_message(step.thought, step.action_text, mapping)})
        episode = Episode(
            messages=messages,
            id=f"trajectory-{t.pk}",
            reward=t.outcome_reward,
            source=t.mode,
            instruction=t.task.instruction,
            meta={"trajectory_id": t.pk, "store": routes[t.pk]},
        )
        built[routes[t.pk]].append((episode, images))
    for kind, items in built.items():
        base = f"naive/{kind}"
        lines = "".join(episode.to_json() + "\n" for episode, _ in items)
        _replace(f"{base}/episodes.jsonl", ContentFile(lines.encode()))
        for _, images in items:
            for relative, data in images:
                _replace(f"{base}/{relative}", ContentFile(data))
        rows = [
            {
                "id": e.id,
                "trajectory_id": e.meta["trajectory_id"],
                "source": e.source,
                "instruction": e.instruction,
                "reward": e.reward,
                "messages": formats.chat_messages(e),
                "images": [{"bytes": data, "path": path} for path, data in images],
                "meta": json.dumps(e.meta),
            }
            for e, images in items
        ]
        schema = formats.parquet_schema("bytes")
        table = pa.Table.from_pylist(rows, schema=schema)
        with default_storage.open(f"{base}/data.parquet", "wb") as out:
            pq.write_table(table, out, **formats.parquet_options(schema))
    return len(trajectories)


def child(variant: str, iteration_pk: int) -> None:
    """Export one iteration with one variant in this fresh process; print JSON with the time and memory."""
    import django

    django.setup()
    import pyarrow.parquet  # noqa: F401 (imported before measuring, as the export imports it)
    from django.conf import settings
    from django.db import connection

    from flywheel import export, formats
    from flywheel.models import DatasetVersion, Iteration

    DatasetVersion.objects.all().delete()  # every variant exports the same rows afresh
    shutil.rmtree(Path(settings.MEDIA_ROOT) / "flywheel", ignore_errors=True)
    shutil.rmtree(Path(settings.MEDIA_ROOT) / "naive", ignore_errors=True)
    iteration = Iteration.objects.get(pk=iteration_pk)
    connection.ensure_connection()
    every = formats.writers
    if variant == "episodes":
        formats.writers = lambda *a, **k: []  # type: ignore[assignment]
    elif variant == "parquet":
        formats.writers = lambda *a, **k: [w for w in every(*a, **k) if w.role == "parquet"]  # type: ignore[assignment]
    before = rss_bytes()
    started = time.perf_counter()
    cpu = time.process_time()
    if variant == "naive":
        count = naive_export(iteration)
    else:
        output = export.export_iteration(iteration)
        count = sum(v["added"] for v in output.values() if v)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    media = Path(settings.MEDIA_ROOT)
    written = sum(p.stat().st_size for p in media.rglob("*") if p.is_file() and "shots" not in p.parts)
    print(
        json.dumps(
            {
                "count": count,
                "seconds": seconds,
                "cpu": time.process_time() - cpu,
                "peak_delta": peak - before,
                "written": written,
            }
        )
    )


def run_child(env: dict[str, str], variant: str, iteration_pk: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--iteration", str(iteration_pk)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="trajectories per size, comma-separated")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--naive-max", type=int, default=10_000, help="largest size the baseline runs at")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--iteration", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        child(args.child, args.iteration)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    variants = args.variants.split(",")
    media = tempfile.mkdtemp(prefix="flywheel-export-bench-")
    env = bench_env(media)
    fv.create_database(env)
    os.environ.update(env)
    import django

    django.setup()
    results: list[tuple[int, str, dict[str, Any]]] = []
    try:
        from flywheel.iterations import validate_and_route

        rng = random.Random(0)
        shots = screenshots(Path(media), rng)
        shot_kb = sum((Path(media) / s).stat().st_size for s in shots) / len(shots) / 1024
        fv.log(f"{SHOTS} screenshots {SCREEN[0]}x{SCREEN[1]}, {shot_kb:.0f} KiB each on average")
        for size in sizes:
            domain = f"n{size}"
            fv.log(f"seeding {size:,} trajectories x {args.steps} steps (COPY)")
            seed(size, args.steps, domain, shots, rng)
            iteration = fv.iteration_for(domain)
            routes = validate_and_route(iteration, chunk=2000)["routes"]
            fv.log(f"  routed: {routes}")
            for variant in variants:
                if variant == "naive" and size > args.naive_max:
                    fv.log(f"  {VARIANTS[variant]}: skipped above {args.naive_max:,}")
                    continue
                fv.log(f"  {VARIANTS[variant]}…")
                result = run_child(env, variant, iteration.pk)
                fv.log(
                    f"    {result['count']:,} trajectories in {result['seconds']:.1f} s, "
                    f"peak +{result['peak_delta'] / MB:.0f} MiB"
                )
                results.append((size, variant, result))
    finally:
        if not args.keep:
            fv.drop_database(env)
        shutil.rmtree(media, ignore_errors=True)
    report(results, args.steps, shot_kb)


def report(results: list[tuple[int, str, dict[str, Any]]], steps: int, shot_kb: float) -> None:
    """The table: per size and variant, trajectories/s and peak memory, as ratios to the baseline of that size (or
    of the largest size it ran at)."""
    naive = {size: r for size, variant, r in results if variant == "naive"}
    print()
    print(f"Flywheel export, {steps} steps a trajectory, screenshots {SCREEN[0]}x{SCREEN[1]} PNG (~{shot_kb:.0f} KiB)")
    print()
    print(
        "| size | variant | trajectories | wall s | trajectories/s | CPU s | trajectories per CPU-s "
        "| peak memory (MiB over start) "
        "| written MiB | speed vs baseline | memory vs baseline |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, variant, r in results:
        base = naive.get(size)
        rate = r["count"] / r["seconds"]
        speed = f"{rate / (base['count'] / base['seconds']):.2f}x" if base else "—"
        memory = f"{r['peak_delta'] / base['peak_delta']:.3f}x" if base and base["peak_delta"] > 0 else "—"
        print(
            f"| {size:,} | {VARIANTS[variant]} | {r['count']:,} | {r['seconds']:.1f} | {rate:,.0f} | {r['cpu']:.1f} "
            f"| {r['count'] / r['cpu']:,.0f} "
            f"| {r['peak_delta'] / MB:,.0f} | {r['written'] / MB:,.0f} | {speed} | {memory} |"
        )
    streamed = {size: r for size, variant, r in results if variant == "all"}
    if len(streamed) > 1:
        small, large = min(streamed), max(streamed)
        growth = streamed[large]["peak_delta"] / max(streamed[small]["peak_delta"], 1)
        print(
            f"\nstreamed export (every format): peak memory at {large:,} is {growth:.2f}x that at {small:,} "
            f"({large / small:.0f}x the trajectories)"
        )
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} (1 min) on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
