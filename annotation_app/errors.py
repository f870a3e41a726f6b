"""Error pages: a short, clear message (JSON under /api/, HTML elsewhere), never a traceback outside DEBUG."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

MESSAGES = {
    400: "The request could not be understood.",
    403: "You don't have permission to do this.",
    404: "There is nothing here.",
    500: "Something went wrong on our side; the error was logged.",
}


def _respond(request: HttpRequest, status: int, detail: str = "") -> HttpResponse:
    message = detail or MESSAGES[status]
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status)
    response = render(request, "error.html", {"status": status, "message": message}, status=status)
    response.styled_error = True  # type: ignore[attr-defined]
    return response


def _detail(exception: Exception | None) -> str:
    """Sentences we (or get_object_or_404) wrote are shown; Django's internal resolver details are not."""
    first = exception.args[0] if exception is not None and exception.args else None
    return first if isinstance(first, str) and first.endswith(".") else ""


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _respond(request, 400)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _respond(request, 403, _detail(exception))


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _respond(request, 404, _detail(exception))


def server_error(request: HttpRequest) -> HttpResponse:
    return _respond(request, 500)


class StyledNotFound:
    """With DEBUG on, Django answers an unknown URL with its technical page (the whole URL conf) instead of
    handler404; this middleware answers it with the same page as in production. JSON 404s (the API) stay as they are."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and response.get("Content-Type", "").startswith("text/html")
            and not getattr(response, "styled_error", False)
        ):
            return page_not_found(request)
        return response
