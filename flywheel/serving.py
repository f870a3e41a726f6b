"""Whether a registered model can serve proposals now: promoting one that cannot would make every new live session
fail ("has no endpoint URL", or a server that does not answer)."""

from __future__ import annotations

import httpx
from django.conf import settings

from .models import ModelVersion

CHECK_TIMEOUT_S = 3.0


def serving_problem(model: ModelVersion, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Why `model` cannot serve right now, or None: its OpenAI-compatible endpoint answers `GET /models` and lists
    the name it is served under."""
    if not model.endpoint_url:
        return "it has no endpoint URL (register the OpenAI-compatible server that serves it, e.g. vllm serve)"
    url = model.endpoint_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {settings.POLICY_API_KEY}"} if settings.POLICY_API_KEY else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"its endpoint {model.endpoint_url} does not answer ({exc or type(exc).__name__})"
    if response.status_code != 200:
        return f"its endpoint answered {response.status_code} to GET {url}"
    try:
        served = [str(m.get("id")) for m in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return f"its endpoint's GET {url} is not an OpenAI model list"
    if served and model.model_name not in served:
        return f"its endpoint serves {', '.join(served)}, not {model.model_name}"
    return None
