"""The recorder's small parts: key names, the hotkey, audio alignment and sources, the config file."""

from __future__ import annotations

import io
import stat
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile

from recorder import config
from recorder.audio import FileAudio, Microphone, align
from recorder.capture import Stats
from recorder.errors import AudioError, RecorderError
from recorder.hotkey import NONE, REPEAT, TOGGLE, HotkeyMatcher, parse_hotkey
from recorder.indicator import run_indicator
from recorder.keys import pynput_key, x11_key
from recorder.x11 import ServerClock

from .conftest import make_wav


@pytest.mark.parametrize(
    ("keysym", "key"),
    [
        (0x61, "a"), (0x41, "A"), (0x20, " "), (0x31, "1"), (0xE9, "é"), (0xFF0D, "enter"), (0xFF08, "backspace"),
        (0xFF09, "tab"), (0xFF1B, "esc"), (0xFFE3, "ctrl"), (0xFFE2, "shift"), (0xFFE9, "alt"), (0xFFEB, "cmd"),
        (0xFF52, "up"), (0xFFC2, "f5"), (0xFF55, "pageup"), (0xFFFF, "delete"), (0xFFAB, "+"), (0xFFB7, "7"),
        (0x1000416, "Ж"), (0x20AC, "€"), (0, None),
    ],
)  # fmt: skip
def test_x11_keys_are_characters_or_names(keysym, key):
    assert x11_key(keysym) == key


def test_pynput_keys_get_the_same_names():
    assert pynput_key(SimpleNamespace(name="ctrl_r")) == "ctrl"
    assert pynput_key(SimpleNamespace(name="page_down")) == "pagedown"
    assert pynput_key(SimpleNamespace(name="space")) == " "
    assert pynput_key(SimpleNamespace(name="f5")) == "f5"
    assert pynput_key(SimpleNamespace(char="\x03")) == "c"  # ctrl+c on Windows
    assert pynput_key(SimpleNamespace(char="Q")) == "Q"


def test_the_hotkey_needs_exactly_its_modifiers():
    hotkey = parse_hotkey("Control+Alt+P")
    assert str(hotkey) == "ctrl+alt+p"
    matcher = HotkeyMatcher(hotkey)
    assert matcher.press(37, "ctrl") == matcher.press(64, "alt") == NONE
    assert matcher.press(33, "p") == TOGGLE
    assert matcher.press(33, "p") == REPEAT  # held down: X11 auto-repeats the press
    matcher.release(33)
    assert matcher.press(33, "P") == TOGGLE
    matcher.release(33)
    assert matcher.press(50, "shift") == NONE and matcher.press(33, "P") == NONE  # ctrl+alt+shift+p is another key
    matcher.release(33)
    matcher.release(50)
    matcher.release(64)
    assert matcher.press(33, "p") == NONE
    for bad in ("p", "ctrl+alt", "ctrl+a+b", ""):
        with pytest.raises(RecorderError):
            parse_hotkey(bad)


def test_x_server_event_times_on_the_monotonic_clock():
    clock = ServerClock()
    assert clock(5000, arrived=100.020) == pytest.approx(100.020)
    assert clock(5100, arrived=100.300) == pytest.approx(100.120)  # it arrived late (a batch): its own time counts
    assert clock(5200, arrived=100.210) == pytest.approx(100.210)  # less delayed than the first: the offset follows
    assert clock(2**32 - 10, arrived=200.0) == pytest.approx(200.0)  # the server's clock jumped: resynchronised
    assert clock(20, arrived=200.03) == pytest.approx(200.03)  # ... and wraps at 2**32 ms


def test_audio_alignment_pads_lost_time_and_drops_excess():
    assert align(written=1000, expected=1010, frames=100, tolerance=50) == (0, 0)  # jitter: left alone
    assert align(written=1000, expected=1600, frames=100, tolerance=50) == (600, 0)  # buffers lost: silence
    assert align(written=1600, expected=1000, frames=100, tolerance=50) == (0, 100)  # ahead: drop (at most a block)
    assert align(written=1100, expected=1000, frames=300, tolerance=50) == (0, 100)


def test_microphone_blocks_land_at_their_time_on_the_capture_clock(tmp_path):
    """The microphone's writer, fed blocks the way PortAudio's callback gets them (no device needed): the first block
    sets the offset, a lost buffer becomes silence, a device running ahead is trimmed, a pause records silence."""
    rate = 8000
    microphone = Microphone(samplerate=rate)
    clock = [0.0]
    microphone._open(tmp_path, lambda: clock[0], rate, 1)

    def block(start: float, value: int, frames: int = 400) -> None:
        clock[0] = start + 0.03  # the callback runs 30 ms after the block's first sample was taken
        timing = SimpleNamespace(currentTime=500 + clock[0], inputBufferAdcTime=500 + start)
        microphone._callback(np.full((frames, 1), value, dtype="int16"), frames, timing, None)

    block(10.00, 1)
    block(10.05, 2)
    block(10.20, 3)  # the blocks of 10.10 and 10.15 were lost
    microphone.pause()
    block(10.25, 4)
    microphone.resume()
    block(10.25, 5)  # the device clock ran ahead: this block's time is already written
    block(10.30, 6)
    microphone.stop()
    assert microphone.offset == pytest.approx(10.0) and microphone.file == "audio.wav"
    samples, got_rate = soundfile.read(str(tmp_path / "audio.wav"), dtype="int16")
    expected = np.repeat([1, 2, 0, 3, 0, 6], [400, 400, 800, 400, 400, 400])
    assert got_rate == rate and np.array_equal(samples, expected)


def test_no_microphone_is_a_clear_error():
    import sounddevice

    try:
        sounddevice.query_devices(kind="input")
    except Exception:
        pass
    else:
        pytest.skip("this machine has a microphone")
    with pytest.raises(AudioError, match=r"no microphone found .*--audio-file FILE or --no-audio"):
        Microphone().check()
    with pytest.raises(AudioError, match="no input device 'nonexistent mic' found"):
        Microphone("nonexistent mic").check()


def test_file_audio_copies_known_formats_and_converts_others(tmp_path):
    wav = make_wav(tmp_path / "a.wav", seconds=0.5)
    flac = tmp_path / "b.flac"
    aiff = tmp_path / "c.aiff"
    data, rate = soundfile.read(str(wav), dtype="int16")
    soundfile.write(str(flac), data, rate)
    soundfile.write(str(aiff), data, rate)
    for source, name in ((wav, "audio.wav"), (flac, "audio.flac"), (aiff, "audio.wav")):
        out = tmp_path / f"out-{source.suffix[1:]}"
        out.mkdir()
        audio = FileAudio(source, offset=1.5 if source is aiff else None)
        audio.start(out, clock=lambda: 0.25)
        audio.stop()
        assert audio.file == name and audio.offset == (1.5 if source is aiff else 0.25)
        copied, copied_rate = soundfile.read(str(out / name), dtype="int16")
        assert copied_rate == rate and np.array_equal(copied, data)
    with pytest.raises(AudioError, match="does not exist"):
        FileAudio(tmp_path / "missing.wav").check()


def test_the_indicator_falls_back_to_the_terminal_without_a_gui():
    out = io.StringIO()
    deadline = time.monotonic() + 0.3
    kind = run_indicator(
        "auto",
        ":4321",
        lambda: Stats(61.0, Counter({"down": 2, "up": 2}), 3, False, None),
        lambda: time.monotonic() > deadline,
        out,
    )
    assert kind == "terminal" and out.getvalue().startswith("REC 01:01  2 actions  4 events  3 frames")


def test_config_file_is_private_and_the_environment_overrides_it(tmp_path, monkeypatch):
    for name in (config.ENV_SERVER, config.ENV_TOKEN, config.ENV_HOME, config.ENV_CONFIG):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(RecorderError, match="not logged in"):
        config.require_login()
    path = config.save("https://annotate.example.org/api/", "k1")
    assert path == tmp_path / "xdg" / "thinkaloud" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert config.load() == config.Config("https://annotate.example.org", "k1")
    monkeypatch.setenv(config.ENV_TOKEN, "k2")
    monkeypatch.setenv(config.ENV_SERVER, "http://localhost:8000")
    assert config.load() == config.Config("http://localhost:8000", "k2")
    assert config.data_dir() == tmp_path / "home" / ".local" / "share" / "thinkaloud"
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path / "data"))
    assert config.data_dir() == tmp_path / "data"
    with pytest.raises(RecorderError, match="must start with http"):
        config.normalize_server("annotate.example.org")
