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


class _Pipe(io.RawIOBase):
    """A write-only, unseekable sink: what MediaRecorder streams to, so the muxer cannot go back to write a duration."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def, override]
        self.data += b
        return len(b)


def _browser_webm(seconds: float) -> bytes:
    import av

    sink = _Pipe()
    with av.open(sink, "w", format="webm") as container:
        stream = container.add_stream("libopus", rate=48000)
        stream.layout = "mono"
        t = np.arange(int(seconds * 48000)) / 48000
        samples = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        for i in range(0, len(samples), 960):
            frame = av.AudioFrame.from_ndarray(samples[i : i + 960].reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = 48000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return bytes(sink.data)


def test_a_browser_webm_without_a_duration_is_remuxed_to_declare_it():
    from annotation_app.insitu.audio import probe_duration, with_duration

    recorded = _browser_webm(5.0)
    assert probe_duration(recorded) is None  # what the player saw: no duration, no seeking
    fixed = with_duration(recorded)
    assert abs(probe_duration(fixed) - 5.0) < 0.1
    assert abs(load_audio(fixed).size / SAMPLE_RATE - load_audio(recorded).size / SAMPLE_RATE) < 0.01  # same audio
    assert with_duration(fixed) is fixed and with_duration(_wav(1.0)) == _wav(1.0)  # nothing else is touched
