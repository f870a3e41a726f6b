"""Errors the recorder expects (no display, no microphone, no server, bad token): the CLI prints their message alone,
never a traceback."""

from __future__ import annotations


class RecorderError(Exception):
    """An expected failure, with a message meant for the annotator."""


class CaptureError(RecorderError):
    """The capture could not start or its X display / input listener went away."""


class AudioError(RecorderError):
    """No usable audio input (no microphone, bad device, unreadable audio file)."""


class ServerError(RecorderError):
    """The server could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthError(ServerError):
    """The server rejected the token (401/403)."""


class UploadError(ServerError):
    """The upload could not complete (it can be resumed later)."""


class SessionError(RecorderError):
    """A session directory is missing, ambiguous or not a capture."""
