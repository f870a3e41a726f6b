"""Template filters of the quality pages: ratios as percentages, empty where there is nothing to divide."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def pct(value: float | None) -> str:
    """0.8734 -> '87.3 %'; None -> '–' (no data, which is not 0 %)."""
    return "–" if value is None else f"{100 * value:.1f} %"


@register.filter
def num(value: float | None, digits: int = 1) -> str:
    """A rate with `digits` decimals; None -> '–'."""
    return "–" if value is None else f"{value:.{digits}f}"
