"""Audio decoding tells the annotator when a recording is cut short instead of silently transcribing a part of it."""

import io
import wave

import numpy as np

from annotation_app.insitu.audio import SAMPLE_RATE, load_audio


def _wav(seconds: float) -> bytes:
    """A 16 kHz mono 16-bit WAV of a quiet tone, `seconds` long."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    samples = (0.1 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(samples.tobytes())
    return out.getvalue()


def test_a_wav_cut_to_a_third_of_its_bytes_decodes_what_it_holds_and_warns():
    data = _wav(45.0)
    warnings: list[str] = []
    audio = load_audio(data[: int(len(data) * 0.3)], warnings=warnings)
    assert abs(audio.size / SAMPLE_RATE - 13.5) < 0.1
    assert len(warnings) == 1
    assert "cut short" in warnings[0] and "45.0 s" in warnings[0] and "13.5 s" in warnings[0]


def test_a_whole_recording_gives_no_warning():
    warnings: list[str] = []
    audio = load_audio(_wav(45.0), warnings=warnings)
    assert abs(audio.size / SAMPLE_RATE - 45.0) < 0.01
    assert warnings == []
