"""Smart resize and model <-> screen coordinates."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.coordinates import FACTOR, MAX_PIXELS, MIN_PIXELS, CoordinateMode, ScreenMapping, smart_resize


@pytest.mark.parametrize(
    ("size", "resized"),
    [
        ((1080, 1920), (1092, 1932)),
        ((800, 1280), (812, 1288)),
        ((28, 28), (280, 280)),
        ((2160, 3840), (2156, 3836)),
        ((4320, 7680), (2688, 4760)),
    ],
)
def test_known_sizes(size, resized):
    assert smart_resize(*size) == resized


@given(st.integers(28, 8000), st.integers(28, 8000))
def test_resized_sides_are_multiples_of_28_within_the_pixel_budget(height, width):
    if max(height, width) / min(height, width) > 200:
        return
    h, w = smart_resize(height, width)
    assert h % FACTOR == 0 and w % FACTOR == 0
    assert MIN_PIXELS <= h * w <= MAX_PIXELS


@given(st.integers(280, 8000), st.integers(280, 8000))
def test_screen_sized_images_keep_their_aspect_ratio(height, width):
    h, w = smart_resize(height, width)
    assert abs(h / w - height / width) / (height / width) < 0.15


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 100)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 5000)


def test_model_to_screen_and_back():
    mapping = ScreenMapping(1920, 1080)
    assert mapping.model_size == (1932, 1092)
    assert mapping.to_screen(1932, 1092) == (1919, 1079)  # clamped to the last pixel
    assert mapping.to_screen(966, 546) == (960, 540)
    assert mapping.to_model(960, 540) == (966, 546)
    relative = ScreenMapping(1280, 800, CoordinateMode.RELATIVE_1000)
    assert relative.model_size == (1000, 1000) and relative.to_screen(500, 500) == (640, 400)


@given(st.integers(0, 1919), st.integers(0, 1079))
def test_screen_to_model_to_screen_stays_within_a_pixel(x, y):
    mapping = ScreenMapping(1920, 1080)
    sx, sy = mapping.to_screen(*mapping.to_model(x, y))
    assert abs(sx - x) <= 1 and abs(sy - y) <= 1
