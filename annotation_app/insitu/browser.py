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
from datetime import timedelta

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import Case, QuerySet, TextField, Value, When
from django.utils import timezone

from sandbox.client import SandboxClient, SandboxError, SessionGoneError

from .. import queues
from ..live.sessions import release_quietly, sandbox_as
from ..models import Assignment, Capture, Task, User
from ..task_queue import current_assignment
from ..trajectories import Conflict, Invalid
from ..upload_checks import AUDIO_FORMATS, check_upload
from .audio import with_duration
from .uploads import _enqueue, archive_file, check_room

log = logging.getLogger(__name__)

STARTING, READY = Capture.STAGE_STARTING, Capture.STAGE_READY

NO_TASK = "Take a task from the queue first."
LEASE_GONE = "The lease on the desktop expired before recording started; start again from the Think-aloud page."

BROWSER_AUDIO = {"audio/webm": "webm", "audio/ogg": "ogg", "audio/wav": "wav"}


def sandbox_for(capture: Capture) -> SandboxClient:
    """The sandbox service, as the owner of this capture's desktop lease."""
    return sandbox_as(f"capture:{capture.pk}")


def open_browser_capture(annotator: User) -> Capture:
    """The annotator's open browser capture of their current task (its desktop starting, or ready to record), or a
    new one whose desktop is leased and set up in a Celery task (`start_desktop`), so a slow setup never holds the
    request: the page shows "starting the desktop" meanwhile.

    A double submit, or coming back to the task, resumes the open capture instead of leasing a second desktop. One
    whose desktop lease is gone, or whose desktop did not start in time, fails and is not resumed. Concurrent starts
    are serialised by a lock on the assignment: the second waits, then finds the first one's capture."""
    assignment = current_assignment(annotator)
    if assignment is None:
        raise Conflict(NO_TASK)
    task = assignment.task
    # Outside the lock: checking a lease is a call to the sandbox service, which must not hold the assignment.
    for capture in _open_captures(annotator, task):
        if _desktop_alive(capture):
            return capture
    check_room(annotator)  # a full quota refuses a new desktop (413) instead of a recording lost at the upload
    with transaction.atomic():
        locked = Assignment.objects.select_for_update().filter(pk=assignment.pk, status=Assignment.Status.ACTIVE)
        if locked.values_list("pk", flat=True).first() is None:
            raise Conflict(NO_TASK)  # submitted or skipped meanwhile
        # Read after the lock: a start that held it before this one has committed its capture by now.
        existing = _open_captures(annotator, task).first()
        if existing is not None:
            return existing
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
        transaction.on_commit(lambda: queues.enqueue(queues.START_CAPTURE, capture.pk))
    return capture


def _open_captures(annotator: User, task: Task) -> QuerySet[Capture]:
    """The annotator's browser captures of this task that have not started recording yet, newest first."""
    return Capture.objects.filter(
        annotator=annotator,
        task=task,
        source=Capture.Source.BROWSER,
        status=Capture.Status.RECORDING,
        stage__in=[STARTING, READY],
    ).order_by("-created_at", "-id")


def _desktop_alive(capture: Capture) -> bool:
    """Whether an open capture can be resumed: its desktop is still starting (within CAPTURE_START_TIMEOUT_S), or
    ready and its lease renews. A lease that is gone fails the capture; a sandbox service that does not answer
    leaves it be (the lease may well outlive the outage), as live annotation does."""
    if capture.stage == STARTING:
        return time_out_start(capture).status == Capture.Status.RECORDING
    session_id = capture.meta.get("sandbox_session", "")
    try:
        sandbox_for(capture).renew(session_id, settings.LIVE_LEASE_TTL_S)
    except SessionGoneError:
        Capture.objects.filter(
            pk=capture.pk, status=Capture.Status.RECORDING, stage=READY, meta__sandbox_session=session_id
        ).update(status=Capture.Status.FAILED, stage="failed", error=LEASE_GONE, updated_at=timezone.now())
        return False
    except SandboxError as exc:
        log.warning("could not renew the desktop lease of browser capture %s: %s", capture.pk, exc)
    return True


def time_out_start(capture: Capture) -> Capture:
    """Fail a browser capture whose desktop has not started CAPTURE_START_TIMEOUT_S after it was created (no worker
    on the `live` queue took it, or its setup is still running) and give back any lease it holds; the capture as
    it now stands. A compare-and-set on the capture still starting: a desktop that became ready meanwhile is kept,
    and the Celery task, should it come later, finds the capture no longer starting and releases what it leased."""
    if not (capture.source == Capture.Source.BROWSER and capture.pending):
        return capture
    limit = settings.CAPTURE_START_TIMEOUT_S
    cutoff = timezone.now() - timedelta(seconds=limit)
    if capture.created_at > cutoff:
        return capture
    late = f"The desktop did not start within {limit:g} s"
    error = Case(
        When(meta__has_key="sandbox_session", then=Value(f"{late}: the task's setup was still running.")),
        default=Value(f"{late}; is a worker running on the live queue?"),
        output_field=TextField(),
    )
    failed = _still_starting(capture.pk).filter(created_at__lte=cutoff)
    if failed.update(status=Capture.Status.FAILED, stage="failed", error=error, updated_at=timezone.now()):
        session_id = Capture.objects.filter(pk=capture.pk).values_list("meta__sandbox_session", flat=True).first()
        if session_id:
            release_quietly(sandbox_for(capture), session_id)
    try:
        capture.refresh_from_db()
    except Capture.DoesNotExist:  # deleted meanwhile: the caller answers with what it has
        pass
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
    check_room(capture.annotator)  # the quota may have filled since the desktop was leased (another upload)
    client = sandbox_for(capture)
    client.renew(session_id, settings.LIVE_LEASE_TTL_S)
    t = client.capture_start(session_id, instruction=capture.instruction, task_id=capture.task_id)
    Capture.objects.filter(pk=capture.pk).update(stage="recording")
    return t


def finish_recording(capture: Capture, audio: UploadedFile | None, audio_offset: float) -> Capture:
    """Stop the desktop capture, add the browser's audio to its archive, queue processing, then release the desktop.

    The desktop is given back only once the archive is written and the capture queued: a failure before that leaves
    the lease in place (the capture stays 'recording'; cancelling it, or the lease's expiry, gives the desktop back)."""
    session_id = _session(capture)
    if audio is not None:
        checked = check_upload(audio, what="audio", max_bytes=settings.MAX_AUDIO_BYTES, formats=AUDIO_FORMATS)
        if checked.content_type not in BROWSER_AUDIO:
            raise Invalid(f"Browser audio must be WebM, Ogg or WAV, not {checked.content_type}.")
    client = sandbox_for(capture)
    archive = client.capture_stop(session_id)
    files, meta = {}, {"session_id": str(capture.session_id)}
    if audio is not None:
        name = f"audio.{BROWSER_AUDIO[checked.content_type]}"
        files[name] = with_duration(audio.read())  # MediaRecorder's WebM declares no duration: players can't seek
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
    release_quietly(client, session_id)
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
