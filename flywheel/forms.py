"""The ML engineer's forms: start an iteration (the twin of POST /api/flywheel/iterations/) and register a model."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from annotation_app.models import Trajectory

from .iterations import COORDINATES
from .models import AVAILABLE_STAGES, Iteration, ModelVersion, Stage
from .validation import VConfig

TRAINING_STAGES = {Stage.CT, Stage.SFT, Stage.VALUE, Stage.PPO}
PROMOTE_CHOICES = [("manual", "No: I promote by hand"), ("auto", "Yes, when it beats the active model")]
PRESETS = [("tiny-cpu", "tiny-cpu (the CPU demonstration)"), ("default", "default (the trainer's defaults)")]


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
        choices=lambda: [(s.value, _stage_label(s)) for s in Stage],
        initial=[Stage.VALIDATE.value, Stage.EXPORT.value],
        widget=forms.CheckboxSelectMultiple,
    )
    promote = forms.ChoiceField(
        choices=PROMOTE_CHOICES,
        initial="manual",
        required=False,
        help_text="After the evaluation stage: promote the new model when it beats the active one.",
    )
    preset = forms.ChoiceField(
        choices=PRESETS, initial="tiny-cpu", required=False, label="Trainer preset", help_text="For training stages."
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
        """The iteration's config; `train` only with a training stage, `promote` only with the evaluation stage."""
        data = self.cleaned_data
        config: dict[str, Any] = {
            "v": {**data["v_config"], "threshold": data["threshold"]},
            "export": {"coordinates": data["coordinates"]},
        }
        if set(data["stages"]) & TRAINING_STAGES:
            config["train"] = {"preset": data["preset"] or "tiny-cpu"}
        if Stage.EVALUATE in data["stages"]:
            config["promote"] = data["promote"] or "manual"
        return config


class RegisterModelForm(forms.Form):
    """Register a model trained or served elsewhere (the page's twin of POST /api/flywheel/models/)."""

    name = forms.CharField(max_length=100)
    checkpoint_uri = forms.CharField(max_length=500, label="Checkpoint", help_text="Path or URI of the weights.")
    endpoint_url = forms.URLField(
        required=False, assume_scheme="http", label="Endpoint", help_text="OpenAI-compatible base URL, e.g. …/v1."
    )
    served_name = forms.CharField(max_length=200, required=False, help_text="The name the endpoint serves it under.")
    parent = forms.ModelChoiceField(queryset=ModelVersion.objects.all(), required=False, empty_label="(none)")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


def _stage_label(stage: Stage) -> str:
    return stage.label if stage in AVAILABLE_STAGES else f"{stage.label} (not available yet)"


def unavailable_stages() -> list[Stage]:
    """The stages this build lists but refuses to run."""
    return [s for s in Stage if s not in AVAILABLE_STAGES]


UNAVAILABLE_STAGES = unavailable_stages()
