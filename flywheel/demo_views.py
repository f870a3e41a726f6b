"""The flywheel demonstration's report: a page, its PNG and its JSON (`/flywheel/demo/…`), for data leads and ML
engineers. Thin: the figures come from flywheel.demo_report, computed from the database on each request."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .demo_report import build_report, plot_png, roots
from .models import ModelVersion
from .views import reads_stores


class BadRoot(ValueError):
    """`?root=` names no demonstration."""


def _root(request: HttpRequest) -> ModelVersion | None:
    """The demonstration asked for (`?root=<model id>`), else the newest one; None when there is none."""
    raw = request.GET.get("root", "").strip()
    found = roots()
    if not raw:
        return found[0] if found else None
    if not raw.isdigit():
        raise BadRoot(f"root must be a model id (a number), not {raw[:40]!r}")
    for root in found:
        if root.pk == int(raw):
            return root
    raise BadRoot(f"model {raw} is not the root of a flywheel demonstration")


@require_GET
@reads_stores
def demo_page(request: HttpRequest) -> HttpResponse:
    try:
        root = _root(request)
    except BadRoot as exc:
        return render(request, "flywheel/demo.html", {"error": str(exc), "roots": roots()}, status=400)
    report = build_report(root) if root else None
    levels = breakdown_table(report, "by_level")  # shown when the run mixed difficulty levels
    context = {"report": report, "roots": roots(), "root": root, "families": breakdown_table(report),
               "levels": levels if len(levels) > 1 else []}  # fmt: skip
    return render(request, "flywheel/demo.html", context)


def breakdown_table(report: dict | None, by: str = "by_family") -> list[tuple[str, list[dict | None]]]:
    """Rows of a held-out table per family (`by_family`) or difficulty level (`by_level`): (name, its held-out
    result in each iteration or None)."""
    if not report:
        return []
    rows = report["iterations"]
    names = sorted({f for r in rows if r["heldout"] for f in r["heldout"].get(by, {})})
    return [(n, [(r["heldout"] or {}).get(by, {}).get(n) for r in rows]) for n in names]


@require_GET
@reads_stores
def demo_json(request: HttpRequest) -> HttpResponse:
    try:
        root = _root(request)
    except BadRoot as exc:
        return JsonResponse({"detail": str(exc)}, status=400)
    if root is None:
        return JsonResponse({"detail": "no flywheel demonstration has run yet (manage.py flywheel demo)"}, status=404)
    return JsonResponse(build_report(root), json_dumps_params={"indent": 1})


@require_GET
@reads_stores
def demo_png(request: HttpRequest) -> HttpResponse:
    try:
        root = _root(request)
    except BadRoot as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    if root is None:
        return HttpResponse("no flywheel demonstration has run yet", status=404, content_type="text/plain")
    return HttpResponse(plot_png(build_report(root)), content_type="image/png")
