"""Which suite families the demonstration plays: a module of names only, so callers outside the demonstration
(`seed_demo`, on every `scripts/run` start) need not import it (torch, the sandbox client)."""

from __future__ import annotations

# Browser families whose level-1 instances the oracle finishes in a few steps (docs/task-suite.md).
FULL_FAMILIES = ("click-button", "type-field", "radio", "checkboxes", "dropdown", "search")
QUICK_FAMILIES = ("click-button", "radio")
# What scripts/run's default agent learns (flywheel.demo.DEFAULT_PLAN): every browser family of the full plan.
DEFAULT_AGENT_FAMILIES = FULL_FAMILIES
