"""Model coordinates <-> screen pixels for UI-TARS-style models (Qwen2.5-VL smart resize, or relative 0-1000).

UI-TARS-1.5 answers in absolute pixels of the *smart-resized* screenshot: each side rounded to a multiple of 28,
scaled down (floor) when the image has more than 16384*28*28 pixels, or up (ceil) when it has fewer than 100*28*28.
UI-TARS v1 answered in relative 0-1000 coordinates. The screenshot the model sees and the screen the actions run on
must agree: wrong scaling is the most reported bug of such agents.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, TypeVar

FACTOR = 28
MIN_PIXELS = 100 * FACTOR * FACTOR
MAX_PIXELS = 16384 * FACTOR * FACTOR
MAX_ASPECT_RATIO = 200

A = TypeVar("A")


class CoordinateMode(StrEnum):
    ABSOLUTE = "absolute"  # pixels of the smart-resized image (UI-TARS-1.5, Qwen2.5-VL)
    RELATIVE_1000 = "relative1000"  # 0..1000 on each axis (UI-TARS v1)


def smart_resize(
    height: int, width: int, *, factor: int = FACTOR, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """The (height, width) the model sees for a `height` x `width` screenshot. Example: 1080 x 1920 -> 1092 x 1932."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ScreenMapping:
    """How one screen's pixels relate to the coordinates a model reads and writes."""

    screen_width: int
    screen_height: int
    mode: CoordinateMode = CoordinateMode.ABSOLUTE

    @property
    def model_size(self) -> tuple[int, int]:
        """(width, height) of the coordinate space the model works in; screenshots must be sent at this size."""
        if self.mode == CoordinateMode.RELATIVE_1000:
            return 1000, 1000
        height, width = smart_resize(self.screen_height, self.screen_width)
        return width, height

    @property
    def scale(self) -> tuple[float, float]:
        """Screen pixels → model coordinates, per axis (what sandbox.outline.render takes)."""
        model_w, model_h = self.model_size
        return model_w / self.screen_width, model_h / self.screen_height

    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        """A model coordinate as a screen pixel, clamped to the screen."""
        model_w, model_h = self.model_size
        sx = round(x / model_w * self.screen_width)
        sy = round(y / model_h * self.screen_height)
        return min(max(sx, 0), self.screen_width - 1), min(max(sy, 0), self.screen_height - 1)

    def to_model(self, x: float, y: float) -> tuple[int, int]:
        """A screen pixel in model coordinates (e.g. an annotator's click written as a training action)."""
        model_w, model_h = self.model_size
        return round(x / self.screen_width * model_w), round(y / self.screen_height * model_h)


def pixel_of(mapping: ScreenMapping | None) -> Callable[[Any], tuple[int, int]]:
    """Screen pixel of a point (anything with .x and .y): through `mapping` for model coordinates, else as given."""
    if mapping is None:
        return lambda point: (round(point.x), round(point.y))
    return lambda point: mapping.to_screen(point.x, point.y)


def mapping_for(screen_width: int, screen_height: int, model_width: int, model_height: int) -> ScreenMapping:
    """The mapping of a screen whose model frame was `model_width` x `model_height` (stored sessions keep only the
    sizes); ValueError when no coordinate mode gives that frame."""
    for mode in CoordinateMode:
        mapping = ScreenMapping(screen_width, screen_height, mode)
        if mapping.model_size == (model_width, model_height):
            return mapping
    raise ValueError(
        f"a {model_width}x{model_height} model frame is none of the frames of a {screen_width}x{screen_height} screen"
    )


def map_points(actions: list[A], convert: Callable[[float, float], tuple[float, float]]) -> list[A]:
    """`actions` (sandbox.actions dataclasses) with every point (click target, drag ends, scroll anchor) passed
    through `convert`, e.g. `mapping.to_screen` at the model boundary; everything else unchanged."""

    def moved(action: A) -> A:
        points = {
            f.name: type(value)(*convert(value.x, value.y))
            for f in fields(action)  # type: ignore[arg-type]
            if hasattr(value := getattr(action, f.name), "x") and hasattr(value, "y")
        }
        return replace(action, **points) if points else action  # type: ignore[type-var]

    return [moved(action) for action in actions]
