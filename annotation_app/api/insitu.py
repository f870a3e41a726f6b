"""In-situ capture API: resumable checksummed uploads (docs/in-situ.md) and the capture's timeline.

Only the capture's own annotator sees or changes it; everyone else gets 404 (an id reveals nothing).
"""

from __future__ import annotations

from django.conf import settings
from django.http import Http404, UnreadablePostError
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..insitu import browser, timeline, uploads
from ..models import Capture
from ..permissions import Capability, allows

UPLOAD_STATE = inline_serializer(
    "CaptureUpload",
    {
        "id": serializers.IntegerField(),
        "session_id": serializers.UUIDField(),
        "offset": serializers.IntegerField(help_text="Bytes received: where to resume."),
        "size": serializers.IntegerField(),
        "status": serializers.ChoiceField(Capture.Status.choices),
        "chunk_size": serializers.IntegerField(help_text="Bytes to send per PUT."),
        "capture": serializers.IntegerField(),
        "stage": serializers.CharField(),
        "progress": serializers.FloatField(),
        "error": serializers.CharField(),
    },
)


class UploadStartSerializer(serializers.Serializer):
    session_id = serializers.UUIDField()
    size = serializers.IntegerField(min_value=1, help_text="Bytes of the whole tar archive.")
    sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", help_text="SHA-256 of the whole archive, hex.")
    task_id = serializers.IntegerField(required=False, allow_null=True, help_text="Empty for a free-form recording.")
    instruction = serializers.CharField(required=False, allow_blank=True, max_length=10_000)


class ThoughtSerializer(serializers.Serializer):
    thought = serializers.CharField(allow_blank=True, max_length=timeline.MAX_THOUGHT, trim_whitespace=False)


class ChunkParser(BaseParser):
    """Chunk bodies are raw bytes; the view reads them from request.body."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):  # type: ignore[no-untyped-def]
        return {}


def own_capture(request: Request, pk: int) -> Capture:
    capture = Capture.objects.select_related("trajectory").filter(pk=pk, annotator=request.user).first()
    if capture is None:
        raise Http404("No such capture.")
    return capture


class CaptureView(APIView):
    permission_classes = [allows(Capability.ANNOTATE)]
    parser_classes = [JSONParser]


class UploadStartView(CaptureView):
    """Start an upload, or find where an interrupted one stopped (same session id and checksum)."""

    @extend_schema(request=UploadStartSerializer, responses={201: UPLOAD_STATE, 200: UPLOAD_STATE})
    def post(self, request: Request) -> Response:
        form = UploadStartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        capture, created = uploads.start_upload(
            request.user,
            session_id=data["session_id"],
            size=data["size"],
            sha256=data["sha256"],
            task_id=data.get("task_id"),
            instruction=data.get("instruction", ""),
        )
        return Response(uploads.describe(capture), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class UploadView(CaptureView):
    """GET: how far the upload got (`verifying` while the whole file's checksum is computed: ask again shortly).
    PUT: one chunk, with Content-Range and X-Chunk-Sha256."""

    parser_classes = [ChunkParser]

    @extend_schema(responses={200: UPLOAD_STATE})
    def get(self, request: Request, pk: int) -> Response:
        capture = browser.time_out_start(uploads.reclaim_stale(own_capture(request, pk)))
        return Response(uploads.describe(capture))

    @extend_schema(
        request={"application/octet-stream": {"type": "string", "format": "binary"}},
        parameters=[
            OpenApiParameter("Content-Range", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("X-Chunk-Sha256", str, OpenApiParameter.HEADER, required=True),
        ],
        responses={200: UPLOAD_STATE},
    )
    def put(self, request: Request, pk: int) -> Response:
        own_capture(request, pk)
        try:
            body = request.body
        except UnreadablePostError:  # the client dropped mid-chunk: nothing stored, it resumes from the offset
            return Response({"detail": "The chunk was cut off; resume from the offset."}, status=400)
        try:
            capture = uploads.write_chunk(
                pk,
                request.user,
                content_range=request.headers.get("Content-Range"),
                sha256=request.headers.get("X-Chunk-Sha256"),
                body=body,
            )
        except uploads.GapError as exc:
            return Response({"detail": str(exc), "offset": exc.offset}, status=status.HTTP_409_CONFLICT)
        except LookupError:
            raise Http404("No such capture.") from None
        return Response(uploads.describe(capture))


class TimelineView(CaptureView):
    """GET: the capture's steps, words and state. DELETE: remove a capture that was not submitted."""

    @extend_schema(responses={200: inline_serializer("CaptureTimeline", {"id": serializers.IntegerField()})})
    def get(self, request: Request, pk: int) -> Response:
        return Response(timeline.timeline_json(own_capture(request, pk)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        timeline.delete_capture(own_capture(request, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ThoughtView(CaptureView):
    """Replace one step's thought."""

    @extend_schema(
        request=ThoughtSerializer, responses={200: inline_serializer("Thought", {"thought": serializers.CharField()})}
    )
    def put(self, request: Request, pk: int, index: int) -> Response:
        capture = own_capture(request, pk)
        form = ThoughtSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        step = timeline.edit_thought(capture, index, form.validated_data["thought"])
        return Response({"thought": step.thought})


class SubmitView(CaptureView):
    """Submit the capture's trajectory for review."""

    @extend_schema(request=None, responses={200: UPLOAD_STATE})
    def post(self, request: Request, pk: int) -> Response:
        return Response(uploads.describe(timeline.submit_capture(own_capture(request, pk))))


class FinishSerializer(serializers.Serializer):
    audio = serializers.FileField(required=False, help_text="What the page's MediaRecorder recorded (WebM/Ogg/WAV).")
    audio_offset = serializers.FloatField(
        default=0.0, min_value=-3600, max_value=86400, help_text="Capture-clock time of the audio's first sample."
    )


class RecordView(CaptureView):
    """Browser capture: start recording the sandbox desktop's input events; answers the capture clock."""

    @extend_schema(request=None, responses={201: inline_serializer("RecordStarted", {"t": serializers.FloatField()})})
    def post(self, request: Request, pk: int) -> Response:
        return Response({"t": browser.start_recording(own_capture(request, pk))}, status=status.HTTP_201_CREATED)


class FinishView(CaptureView):
    """Browser capture: stop, attach the page's audio, release the desktop and queue processing."""

    parser_classes = [MultiPartParser]

    @extend_schema(request=FinishSerializer, responses={200: UPLOAD_STATE})
    def post(self, request: Request, pk: int) -> Response:
        capture = own_capture(request, pk)
        form = FinishSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        return Response(uploads.describe(browser.finish_recording(capture, data.get("audio"), data["audio_offset"])))


class CaptureVncTokenView(CaptureView):
    """Browser capture: a websockify token for the desktop being recorded (interactive: the annotator drives it)."""

    @extend_schema(request=None, responses={201: inline_serializer("CaptureVnc", {"token": serializers.CharField()})})
    def post(self, request: Request, pk: int) -> Response:
        token = browser.vnc_token(own_capture(request, pk), request.user)
        return Response({"token": token, "port": settings.VNC_PUBLIC_PORT}, status=status.HTTP_201_CREATED)
