#!/usr/bin/env python3
"""In-situ capture uploads: throughput and resume, with the recorder's own upload client over real gunicorn.

Captures of hundreds of MB go up over flaky connections. gunicorn runs as tests/servers.py starts it (gthread,
2 workers x 2 threads, DEBUG off) against the bench database; a recorder session directory of about --upload-mb
(events.jsonl from the synthetic annotator, frame-sized random files) is uploaded by `recorder.upload.Uploader`, the
client `thinkaloud-recorder upload` runs, in --chunk-mib chunks. Between the client and gunicorn sits a small TCP
relay that counts the bytes the client sends; for the cut run it resets both connections once a seeded random number
of bytes has gone through, and the client must notice, ask the server where it is and go on.
Rows: writing the same bytes locally in chunks with SHA-256 and fsync per chunk and a final whole-file SHA-256 (the
baseline: what the server must do at least), uploads.start_upload/write_chunk called in-process (the server's logic
without HTTP), a straight upload through the relay, and the cut one. The stored archives' SHA-256 is checked; MB/s
(from the first byte sent to the upload's end; packing the tar is timed apart), bytes sent beyond one straight
upload's, and the resume latency (reset to the first chunk the server accepts after it).

Usage (PostgreSQL and Redis running): source scripts/env.sh && .venv/bin/python bench/insitu_upload.py
  [--upload-mb 200] [--chunk-mib 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import re
import select
import shutil
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from insitu_common import (
    BENCH_REDIS_DB,
    MB,
    ROOT,
    BenchError,
    SyntheticSession,
    bench_database,
    gunicorn,
    jsonl,
    log,
    machine_line,
    remove_queued,
    run,
    upload_in_process,
)

from recorder.session import Session
from recorder.upload import Uploader
from tests.servers import free_port


class Relay:
    """A TCP relay from a local port to `target` that counts client-to-server bytes and, once `cut_after` of them
    have passed (counted over all connections), resets every open connection once, as a dropped network would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream_bytes = 0
        self.cut_after: int | None = None
        self.cut_at: float | None = None  # perf_counter of the reset
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        with self.lock:
            self.open |= {client, server}
        peers = {client: server, server: client}
        try:
            while not self.stopping:
                ready, _, _ = select.select(list(peers), [], [], 0.5)
                for sock in ready:
                    data = sock.recv(1 << 20)
                    if not data:
                        return
                    if sock is client:
                        data = self._count(data, client, server)
                        if data is None:
                            return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            with self.lock:
                self.open -= {client, server}
            for sock in (client, server):
                sock.close()

    def _count(self, data: bytes, client: socket.socket, server: socket.socket) -> bytes | None:
        """Pass `data` on, or its part before the cut and then reset both ends (None: the connection is gone)."""
        with self.lock:
            if self.cut_after is not None and self.upstream_bytes + len(data) >= self.cut_after:
                keep = self.cut_after - self.upstream_bytes
                self.upstream_bytes += keep
                self.cut_after, self.cut_at = None, time.perf_counter()
                server.sendall(data[:keep])
                time.sleep(0.05)  # let the server start reading the partial body
                for sock in (client, server):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
                    sock.close()
                return None
            self.upstream_bytes += len(data)
        return data

    def close(self) -> None:
        self.stopping = True
        self.listener.close()


def session_dir(root: Path, frames: Path, events: bytes, name: str) -> Session:
    """A finished recorder session with the shared frame files (hard links: no copy of the bytes)."""
    session = Session.create(root / name, instruction="Upload benchmark")
    session.events_path.write_bytes(events)
    for frame in sorted(frames.iterdir()):
        os.link(frame, session.frames_dir / frame.name)
    return session


def make_frames(args: argparse.Namespace, folder: Path) -> int:
    """Frame-sized random files (incompressible, as JPEGs are) adding up to about --upload-mb."""
    rng = np.random.default_rng(args.seed + 3)
    folder.mkdir(parents=True)
    total, i = 0, 0
    while total < args.upload_mb * MB:
        data = rng.bytes(int(rng.integers(600_000, 1_400_000)))
        (folder / f"{i:06d}.jpg").write_bytes(data)
        total += len(data)
        i += 1
    return i


def local_floor(data_path: Path, chunk: int, path: Path) -> float:
    """The least the server does per upload: SHA-256 and fsync per chunk, then SHA-256 of the whole file."""
    started = time.perf_counter()
    with data_path.open("rb") as data, path.open("wb") as out:
        while part := data.read(chunk):
            hashlib.sha256(part).hexdigest()
            out.write(part)
            out.flush()
            os.fsync(out.fileno())
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    sha.hexdigest()
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def upload(
    session: Session, relay: Relay, token: str, chunk: int, cut_after: int | None = None, *, direct: int | None = None
) -> dict[str, Any]:
    """One upload by the recorder's client through the relay (or straight to port `direct`); timings from its
    progress reports."""
    marks: list[tuple[float, int]] = []
    before = relay.upstream_bytes
    pack_started = time.perf_counter()
    packed = session.pack()  # what Uploader.upload() does first (again): timed apart from the network
    pack_s = time.perf_counter() - pack_started
    packed.path.unlink(missing_ok=True)
    relay.cut_after = None if cut_after is None else relay.upstream_bytes + cut_after
    uploader = Uploader(
        f"http://127.0.0.1:{direct or relay.port}", token, chunk_size=chunk, backoff=0.05, max_backoff=0.5,
        progress=lambda sent, _total: marks.append((time.perf_counter(), sent)),
    )  # fmt: skip
    started = time.perf_counter()
    result = uploader.upload(session)
    ended = time.perf_counter()
    sending_from = marks[0][0] if marks else started
    out: dict[str, Any] = {
        "result": result,
        "seconds": ended - sending_from,
        "pack_s": pack_s,
        "wire_bytes": relay.upstream_bytes - before,
        "sizes": packed.size,
    }
    if cut_after is not None:
        if relay.cut_at is None:
            raise BenchError("the relay never cut the connection")
        after = [(t, sent) for t, sent in marks if t > relay.cut_at]
        offset_at_cut = max((sent for t, sent in marks if t <= relay.cut_at), default=0)
        accepted = next((t for t, sent in after if sent > offset_at_cut), None)
        out["resume_s"] = (accepted - relay.cut_at) if accepted else float("nan")
        out["offset_at_cut"] = offset_at_cut
    return out


def stored_sha256(media: Path, pk: int) -> str:
    sha = hashlib.sha256()
    with (media / f"captures/{pk}/capture.tar").open("rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


@contextmanager
def relay_to(port: int) -> Iterator[Relay]:
    relay = Relay(("127.0.0.1", port))
    try:
        yield relay
    finally:
        relay.close()


def table_uploads(
    args: argparse.Namespace, env: dict[str, str], user: Any, token: str, media: Path, tmp: Path
) -> tuple[str, dict[str, Any]]:
    from annotation_app.models import Capture

    chunk = args.chunk_mib << 20
    frames = tmp / "frames"
    count = make_frames(args, frames)
    events = jsonl(SyntheticSession.of_seconds(args.seed + 4, 300).events)
    straight_session = session_dir(tmp, frames, events, "straight")
    cut_session = session_dir(tmp, frames, events, "cut")
    direct_session = session_dir(tmp, frames, events, "direct")
    warm_session = Session.create(tmp / "warm", instruction="Upload benchmark")
    warm_session.events_path.write_bytes(events)
    packed = straight_session.pack(tmp / "floor.tar")
    size = packed.size
    cut = random.Random(args.seed + 5).randrange(size // 10, size * 9 // 10)
    log(f"session of {count} frame files, {size / MB:.1f} MB packed; local floor x3")
    floor = statistics.median(local_floor(packed.path, chunk, media / "floor.bin") for _ in range(3))
    log("in-process start_upload/write_chunk (no HTTP)")
    _capture, in_process = upload_in_process(user, packed.path.read_bytes(), chunk)
    packed.path.unlink()
    port = free_port()
    server_log = media.parent / "gunicorn.log"
    ids: set[int] = set()
    try:
        with gunicorn(env, port, server_log), relay_to(port) as relay:
            log("warming up both workers with a small upload")
            ids.add(upload(warm_session, relay, token, chunk)["result"].capture)
            log("straight upload (recorder.upload.Uploader), straight to gunicorn")
            direct = upload(direct_session, relay, token, chunk, direct=port)
            ids.add(direct["result"].capture)
            log("straight upload through the relay")
            straight = upload(straight_session, relay, token, chunk)
            ids.add(straight["result"].capture)
            log(f"upload cut after {cut:,} bytes on the wire, then resumed by the client")
            cut_run = upload(cut_session, relay, token, chunk, cut_after=cut)
            ids.add(cut_run["result"].capture)
    finally:
        server_text = server_log.read_text(errors="replace") if server_log.exists() else ""
        removed = remove_queued(env, {i for i in ids if i is not None}) if ids else 0
    for r in (direct, straight, cut_run):
        capture = Capture.objects.get(pk=r["result"].capture)
        if capture.status != Capture.Status.QUEUED or stored_sha256(media, capture.pk) != r["result"].sha256:
            raise BenchError(f"capture {capture.pk}: status {capture.status}, stored archive checksum wrong")
    errors = [line for line in server_text.splitlines() if re.search(r" (ERROR|CRITICAL) ", line)]
    log_copy = ROOT / "bench/results/insitu-gunicorn.log"
    log_copy.parent.mkdir(exist_ok=True)
    log_copy.write_text(server_text)
    resent = cut_run["wire_bytes"] - straight["wire_bytes"]
    info = {"size": size, "chunk": chunk, "cut": cut, "cut_run": cut_run, "removed": removed, "errors": errors}
    chunks = math.ceil(size / chunk)
    lines = [
        "| run | seconds | MB/s | vs baseline | packing s | bytes sent beyond a straight upload | resume latency ms |",
        "|---|---|---|---|---|---|---|",
        f"| local write: SHA-256 + fsync per {args.chunk_mib} MiB chunk, whole-file SHA-256 (baseline) | {floor:.2f} "
        f"| {size / MB / floor:.0f} | 1.00x | | | |",
        f"| `uploads.start_upload` + `write_chunk` in-process (the server's logic without HTTP; "
        f"{in_process / chunks * 1000:.0f} ms a chunk) | {in_process:.2f} | {size / MB / in_process:.0f} | "
        f"{floor / in_process:.2f}x | | | |",
    ]
    runs = (
        ("straight upload, client to gunicorn", direct),
        ("straight upload through the relay", straight),
        (f"through the relay, cut after {cut:,} bytes, resumed", cut_run),
    )
    for name, r in runs:
        rate = size / MB / r["seconds"]
        extra = f"{resent:,}" if r is cut_run else ""
        resume = f"{r['resume_s'] * 1000:.0f}" if r is cut_run else ""
        lines.append(
            f"| {name} | {r['seconds']:.2f} | {rate:.0f} | {rate / (size / MB / floor):.2f}x | {r['pack_s']:.2f} | "
            f"{extra} | {resume} |"
        )
    return "\n".join(lines), info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upload-mb", type=float, default=200.0, help="size of the uploaded capture")
    parser.add_argument("--chunk-mib", type=int, default=4, help="upload chunk size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(machine_line(args.seed))
    with bench_database() as (tmp, media, env, user, token):
        try:
            table, info = table_uploads(args, env, user, token, media, tmp)
        finally:
            shutil.rmtree(tmp / "frames", ignore_errors=True)
    r = info["cut_run"]
    print(f"### Upload throughput and resume ({info['size'] / MB:.1f} MB capture, {info['chunk'] >> 20} MiB chunks, "
          f"recorder.upload.Uploader, gunicorn gthread 2x2 on loopback)\n")  # fmt: skip
    print(table + "\n")
    print(f"Cut after {info['cut']:,} bytes on the wire (seed {args.seed}); the server had {r['offset_at_cut']:,} "
          f"bytes then. Both stored archives match their SHA-256; {info['removed']} queued processing message(s) "
          f"removed from Redis db {BENCH_REDIS_DB}. Server log records at ERROR: {len(info['errors'])} "
          f"(bench/results/insitu-gunicorn.log).\n")  # fmt: skip
    for line in info["errors"][:5]:
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    run(main)
