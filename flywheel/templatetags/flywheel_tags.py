"""Template filters of the flywheel pages."""

from typing import Any

from django import template

register = template.Library()


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    """`mapping[key]`, or None (templates cannot index a dict by a variable)."""
    return mapping.get(key) if isinstance(mapping, dict) else None
