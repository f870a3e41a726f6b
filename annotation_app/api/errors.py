"""One JSON error shape for the whole API: {"detail": "...", "errors": {...}?}, never a traceback."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from sandbox.client import SandboxError
from training.policy.client import PolicyError

from ..task_import import TaskImportError
from ..task_queue import QueueEmpty
from ..trajectories import Conflict, Invalid
from ..upload_checks import UploadRejected


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Map domain errors to 4xx answers; everything DRF knows keeps its own status and message."""
    if isinstance(exc, TaskImportError):
        return Response(
            {
                "detail": f"The import was rejected: {exc.total_errors} problem(s); nothing was stored.",
                "errors": [{"record": e.record, "field": e.field, "message": e.message} for e in exc.errors],
            },
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, UploadRejected):
        return Response({"detail": str(exc)}, status=exc.status)
    if isinstance(exc, Conflict):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, Invalid):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, SandboxError | PolicyError):
        message = exc.detail if isinstance(exc, SandboxError) else str(exc)
        return Response({"detail": f"A backing service failed: {message}"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, QueueEmpty):
        return Response({"detail": str(exc)}, status=status.HTTP_404_NOT_FOUND)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" not in response.data:
        response.data = {"detail": "The request has invalid fields.", "errors": response.data}
    elif response is not None and isinstance(response.data, list):
        response.data = {"detail": "The request is invalid.", "errors": response.data}
    return response
