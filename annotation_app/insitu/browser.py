"""Think-aloud in the browser: the annotator drives a sandbox desktop over VNC while the page records the microphone.

The desktop is leased and the task's setup run by a Celery task (`start_desktop`, on the `live` queue) while the
capture page says "starting the desktop"; the capture's `meta.sandbox_session` names it once it is ready to record.
The sandbox service captures input events and frames on the desktop's X display (sandbox.capture); when the
annotator stops, the page sends its audio and the offset between the two clocks, and the server adds the audio to
the sandbox's archive. From there it is an ordinary capture: the same pipeline processes it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import uuid

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from sandbox.client import SandboxClient, SandboxError

from ..live import release_quietly, sandbox_as
from ..models import Capture, User
from ..task_queue import current_assignment
from ..trajectories import Conflict, Invalid
from ..uploads import AUDIO_FORMATS, check_upload
from .uploads import _enqueue, archive_file

log = logging.getLogger(__name__)

STARTING, READY = Capture.STAGE_STARTING, Capture.STAGE_READY

BROWSER_AUDIO = {"audio/webm": "webm", "audio/ogg": "ogg", "audio/wav": "wav"}


def sandbox_for(capture: Capture) -> SandboxClient:
    """The sandbox service, as the owner of this capture's desktop lease."""
    return sandbox_as(f"capture:{capture.pk}")


def open_browser_capture(annotator: User) -> Capture:
    """A new browser capture of the annotator's current task; its desktop is leased and set up in a Celery task
    (`start_desktop`), so a slow setup never holds the request: the page shows "starting the desktop" meanwhile."""
    assignment = current_assignment(annotator)
    if assignment is None:
        raise Conflict("Take a task from the queue first.")
    task = assignment.task
    with transaction.atomic():
        capture = Capture.objects.create(
            annotator=annotator,
            session_id=uuid.uuid4(),
            source=Capture.Source.BROWSER,
            task=task,
            instruction=task.instruction,
            size=0,
            sha256="",
            status=Capture.Status.RECORDING,
            stage=STARTING,
        )
        from ..tasks import start_capture

        transaction.on_commit(lambda: start_capture.delay(capture.pk))
    return capture


def start_desktop(capture_id: int) -> None:
    """Lease a desktop for a new browser capture and run the task's setup (Celery, `live` queue).

    Idempotent: only a capture still starting is touched, so a retried delivery of a started (or cancelled, or
    deleted) capture does nothing. A lease left by a delivery that died midway is given back before starting over;
    a capture cancelled or deleted while its desktop was being prepared gets its lease released, not recorded."""
    capture = _still_starting(capture_id).select_related("task").first()
    if capture is None:
        return
    client = sandbox_for(capture)
    if left := capture.meta.get("sandbox_session"):
        release_quietly(client, left)
    session_id = ""
    try:
        session_id = client.allocate(ttl_s=settings.LIVE_LEASE_TTL_S)["session_id"]
        if not _still_starting(capture_id).update(meta={"sandbox_session": session_id}):
            release_quietly(client, session_id)  # cancelled or deleted meanwhile
            return
        if capture.task is not None and capture.task.setup_config:
            client.setup(session_id, capture.task.setup_config)
    except Exception as exc:
        if session_id:
            release_quietly(client, session_id)
        if isinstance(exc, SandboxError):
            message = f"The sandbox could not be prepared: {exc.detail}"
        else:
            log.exception("browser capture %s: the desktop could not be started", capture_id)
            message = f"The sandbox could not be prepared: {type(exc).__name__}: {exc}"
        _still_starting(capture_id).update(
            status=Capture.Status.FAILED, stage="failed", error=message, updated_at=timezone.now()
        )
        return
    if not _still_starting(capture_id).update(stage=READY, updated_at=timezone.now()):
        release_quietly(client, session_id)


def _still_starting(capture_id: int) -> QuerySet[Capture]:
    """The capture, if it is still waiting for its desktop (an update through this is a compare-and-set)."""
    return Capture.objects.filter(
        pk=capture_id, source=Capture.Source.BROWSER, status=Capture.Status.RECORDING, stage=STARTING
    )


def _session(capture: Capture) -> str:
    """The sandbox session of a browser capture whose desktop is ready; Conflict (409) otherwise."""
    if capture.source != Capture.Source.BROWSER or capture.status != Capture.Status.RECORDING:
        raise Conflict(f"This capture is {capture.get_status_display().lower()}, not recording in the browser.")
    if capture.stage == STARTING or not capture.meta.get("sandbox_session"):
        raise Conflict("The desktop is still starting; try again when the page says it is ready to record.")
    return capture.meta["sandbox_session"]


def vnc_token(capture: Capture, user: User) -> str:
    client = sandbox_for(capture)
    return client.vnc_token(_session(capture), f"user:{user.pk}", settings.LIVE_LEASE_TTL_S)


def start_recording(capture: Capture) -> float:
    """Start the event capture on the desktop; the capture clock when it answered (the page aligns its audio)."""
    session_id = _session(capture)
    client = sandbox_for(capture)
    client.renew(session_id, settings.LIVE_LEASE_TTL_S)
    t = client.capture_start(session_id, instruction=capture.instruction, task_id=capture.task_id)
    Capture.objects.filter(pk=capture.pk).update(stage="recording")
    return t


def finish_recording(capture: Capture, audio: UploadedFile | None, audio_offset: float) -> Capture:
    """Stop the desktop capture, add the browser's audio to its archive, release the desktop and queue processing."""
    session_id = _session(capture)
    if audio is not None:
        checked = check_upload(audio, what="audio", max_bytes=settings.MAX_AUDIO_BYTES, formats=AUDIO_FORMATS)
        if checked.content_type not in BROWSER_AUDIO:
            raise Invalid(f"Browser audio must be WebM, Ogg or WAV, not {checked.content_type}.")
    client = sandbox_for(capture)
    archive = client.capture_stop(session_id)
    release_quietly(client, session_id)
    files, meta = {}, {"session_id": str(capture.session_id)}
    if audio is not None:
        name = f"audio.{BROWSER_AUDIO[checked.content_type]}"
        files[name] = audio.read()
        meta["audio"] = {"file": name, "offset": round(audio_offset, 3)}
    archive = rewrite(archive, files, meta)
    path = archive_file(capture)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(archive)
    with transaction.atomic():
        Capture.objects.filter(pk=capture.pk).update(
            size=len(archive),
            received=len(archive),
            sha256=hashlib.sha256(archive).hexdigest(),
            status=Capture.Status.QUEUED,
            stage="queued",
        )
        transaction.on_commit(lambda: _enqueue(capture.pk))
    capture.refresh_from_db()
    return capture


def abandon(capture: Capture) -> None:
    """Give the desktop back without keeping anything (the annotator cancelled), even while it is still starting:
    then the Celery task that prepares it sees the capture is no longer starting and releases its lease itself."""
    if capture.source != Capture.Source.BROWSER or capture.status != Capture.Status.RECORDING:
        raise Conflict(f"This capture is {capture.get_status_display().lower()}, not recording in the browser.")
    Capture.objects.filter(pk=capture.pk).update(
        status=Capture.Status.FAILED, stage="failed", error="Recording cancelled.", updated_at=timezone.now()
    )
    session_id = Capture.objects.filter(pk=capture.pk).values_list("meta__sandbox_session", flat=True).first()
    if session_id:
        release_quietly(sandbox_for(capture), session_id)


def rewrite(archive: bytes, change: dict[str, bytes], meta_update: dict) -> bytes:
    """The archive with files added or replaced and session.json updated."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            if member.name in change:
                continue
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "session.json" and data is not None:
                meta = {**json.load(data), **meta_update}
                body = json.dumps(meta).encode()
                member.size = len(body)
                dst.addfile(member, io.BytesIO(body))
            else:
                dst.addfile(member, data)
        for name, body in change.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            dst.addfile(info, io.BytesIO(body))
    return out.getvalue()
