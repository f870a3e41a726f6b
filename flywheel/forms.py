"""The ML engineer's form for starting an iteration (the page's twin of POST /api/flywheel/iterations/)."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from annotation_app.models import Trajectory

from .iterations import COORDINATES
from .models import AVAILABLE_STAGES, Iteration, ModelVersion, Stage
from .validation import VConfig


class IterationForm(forms.Form):
    base_model = forms.ModelChoiceField(queryset=ModelVersion.objects.all(), required=False, empty_label="(none)")
    scope = forms.ChoiceField(choices=Iteration.Scope.choices, initial=Iteration.Scope.NEW, required=False)
    modes = forms.MultipleChoiceField(
        choices=Trajectory.Mode.choices, required=False, widget=forms.CheckboxSelectMultiple, help_text="None: all."
    )
    domains = forms.CharField(required=False, help_text="Task domains, comma-separated; empty: all.")
    date_from = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    date_to = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    stages = forms.MultipleChoiceField(
        choices=[(s.value, s.label) for s in AVAILABLE_STAGES],
        initial=[s.value for s in AVAILABLE_STAGES],
        widget=forms.CheckboxSelectMultiple,
    )
    threshold = forms.FloatField(min_value=0.0, max_value=1.0, initial=VConfig().threshold, help_text="V ≥ this: SFT.")
    coordinates = forms.ChoiceField(choices=[(c, c) for c in COORDINATES], initial="absolute")
    v_config = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="More V settings as JSON (weights, flag_values, rules); see docs/flywheel.md.",
    )

    def clean_scope(self) -> str:
        return self.cleaned_data["scope"] or Iteration.Scope.NEW

    def clean_domains(self) -> list[str]:
        return [d.strip() for d in self.cleaned_data["domains"].split(",") if d.strip()]

    def clean_v_config(self) -> dict[str, Any]:
        text = self.cleaned_data["v_config"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(value, dict):
            raise forms.ValidationError('a JSON object, e.g. {"weights": {"review": 3}}')
        return value

    def config(self) -> dict[str, Any]:
        v = {**self.cleaned_data["v_config"], "threshold": self.cleaned_data["threshold"]}
        return {"v": v, "export": {"coordinates": self.cleaned_data["coordinates"]}}


UNAVAILABLE_STAGES = [s for s in Stage if s not in AVAILABLE_STAGES]
