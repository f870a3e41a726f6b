"""Speech recognition of think-aloud audio: both Whisper backends on espeak-ng speech, VAD time mapping, the
CTranslate2 → openai-whisper conversion, and decoding of the audio the recorders upload (good and bad)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import av
import ctranslate2
import numpy as np
import pytest
import soundfile
import torch
import whisper
from ctranslate2.specs import common_spec, model_spec

from annotation_app.insitu import asr, whisper_weights
from annotation_app.insitu.asr import FASTER_WHISPER, OPENAI_WHISPER, Transcript, get_transcriber
from annotation_app.insitu.audio import SAMPLE_RATE, AudioError, duration_seconds, load_audio, probe_duration

from .captures import SCRIPT_WER, wer

# Sentences long enough (10+ words) for tiny.en to hear them within the WER bound on any CPU: its int8 kernels differ
# between CPUs, so no test depends on the exact words it hears.
FIRST = "I need to open the file menu first to find the export option"
SECOND = "the save button is greyed out so I will try the keyboard shortcut"
LEAD, GAP, TAIL = 12.0, 6.0, 2.0  # seconds of silence before, between and after the two sentences
PAD = asr.VadSettings().speech_pad_ms / 1000  # VAD regions start this much before the detected speech
SLACK = 0.5  # seconds a word's time may lie outside its sentence beyond the VAD padding (Whisper's word timing)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


@pytest.fixture(scope="module")
def speech_files(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    folder = tmp_path_factory.mktemp("speech")
    files = {}
    for i, text in enumerate((FIRST, SECOND)):
        files[text] = folder / f"sentence{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(files[text]), text], check=True)
    return files


@pytest.fixture(scope="module")
def speech(speech_files) -> dict[str, np.ndarray]:
    return {text: load_audio(path) for text, path in speech_files.items()}


@pytest.fixture(scope="module")
def think_aloud(speech) -> np.ndarray:
    """Mostly silence: 12 s, the first sentence, 6 s, the second, 2 s."""
    return np.concatenate([silence(LEAD), speech[FIRST], silence(GAP), speech[SECOND], silence(TAIL)])


@pytest.fixture(scope="module")
def whisper_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("whisper-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(whisper_weights.CACHE_ENV, str(cache))
        yield cache


@pytest.fixture(scope="module")
def transcribers(whisper_cache) -> dict[str, asr.Transcriber]:
    return {backend: get_transcriber(backend) for backend in asr.BACKENDS}


@pytest.fixture(scope="module")
def results(transcribers, think_aloud) -> dict[str, tuple[Transcript, list[float]]]:
    """Each backend's transcript of the think-aloud clip, with the progress values it reported."""
    out = {}
    for backend, transcriber in transcribers.items():
        progress: list[float] = []
        out[backend] = transcriber.transcribe(think_aloud, progress=progress.append), progress
    return out


@pytest.mark.parametrize("backend", asr.BACKENDS)
def test_transcribes_known_sentences(results, backend):
    transcript, _ = results[backend]
    assert wer(f"{FIRST}. {SECOND}.", transcript.text) <= 0.25, transcript.text
    assert transcript.backend == backend
    assert transcript.model == "tiny.en"
    assert transcript.language == "en"
    assert transcript.words == [word for segment in transcript.segments for word in segment.words]


@pytest.mark.parametrize("backend", asr.BACKENDS)
def test_word_times_are_monotonic_and_inside_the_audio(results, think_aloud, backend):
    transcript, _ = results[backend]
    duration = duration_seconds(think_aloud)
    assert transcript.duration == pytest.approx(duration)
    starts = [word.start for word in transcript.words]
    assert starts == sorted(starts)
    assert all(0 <= word.start <= word.end <= duration for word in transcript.words)
    assert all(0 <= word.probability <= 1 for word in transcript.words)


@pytest.mark.parametrize("backend", asr.BACKENDS)
def test_words_are_mapped_back_past_the_silence_vad_removed(results, speech, backend):
    """Only speech is decoded, yet words land where they were said: the first sentence's after 12 s of silence, the
    second's 6 s later, none in the silences; the words heard in each span are that sentence."""
    transcript, _ = results[backend]
    first_end = LEAD + duration_seconds(speech[FIRST])
    second_start = first_end + GAP
    spans = {FIRST: (LEAD, first_end), SECOND: (second_start, second_start + duration_seconds(speech[SECOND]))}
    heard: dict[str, list[str]] = {FIRST: [], SECOND: []}
    for word in transcript.words:
        inside = [text for text, (start, end) in spans.items() if start - PAD - SLACK <= word.start <= end + SLACK]
        sentence = inside[0] if inside and word.end <= spans[inside[0]][1] + SLACK else None
        assert sentence is not None, f"{word} lies in a silence"
        heard[sentence].append(word.text)
    for sentence, words in heard.items():
        assert wer(sentence, " ".join(words)) <= SCRIPT_WER, (sentence, words)


@pytest.mark.parametrize("backend", asr.BACKENDS)
def test_progress_reaches_one(results, backend):
    _, progress = results[backend]
    assert progress[0] == 0.0 and progress[-1] == 1.0
    assert progress == sorted(progress) and len(progress) >= 3


@pytest.mark.parametrize("backend", asr.BACKENDS)
def test_silence_gives_no_words(transcribers, backend):
    rng = np.random.default_rng(0)
    quiet = np.concatenate([silence(10), rng.normal(0, 1e-4, 10 * SAMPLE_RATE).astype(np.float32)])
    progress: list[float] = []
    transcript = transcribers[backend].transcribe(quiet, progress=progress.append)
    assert transcript.words == [] and transcript.segments == [] and transcript.text == ""
    assert transcript.duration == pytest.approx(20.0)
    assert progress[-1] == 1.0


def test_transcript_json_round_trip(results):
    transcript, _ = results[FASTER_WHISPER]
    data = transcript.to_json()
    assert Transcript.from_json(data) == transcript
    assert "words" not in data and data["segments"][0]["words"][0]["text"]


def test_converted_model_matches_ctranslate2(speech, whisper_cache):
    """The same fp16 weights in fp32 on both runtimes: encoder output and next-token logits agree, so does the text."""
    model_dir = asr._ct2_dir(None)
    converted = whisper_weights.load_converted(model_dir, cache_dir=whisper_cache)
    reference = ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32")
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(speech[SECOND]), converted.dims.n_mels)[None]
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel.numpy()))
    tokenizer = whisper.tokenizer.get_tokenizer(multilingual=False)
    prompt = [tokenizer.sot, tokenizer.no_timestamps]

    generated = reference.generate(features, [prompt], beam_size=1, return_logits_vocab=True, suppress_blank=False)[0]
    ct2_logits = np.stack([np.asarray(step) for step in generated.logits[0]])
    tokens = generated.sequences_ids[0]
    with torch.no_grad():
        encoded = converted.encoder(mel)
        torch_logits = converted.logits(torch.tensor([prompt + tokens]), encoded)[0, len(prompt) - 1 :].numpy()
    ct2_encoded = np.asarray(reference.encode(features, to_cpu=True))
    assert np.abs(encoded.numpy() - ct2_encoded).max() < 1e-3
    kept = ct2_logits > -1e30  # ctranslate2 reports suppressed tokens as the lowest float
    assert np.abs(torch_logits[kept] - ct2_logits[kept]).max() < 1e-2
    # The same next token wherever the choice is clear; a near tie may go either way on another CPU's numerics.
    top2 = np.sort(np.where(kept, ct2_logits, -np.inf), axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2e-2
    assert clear.sum() >= 0.8 * len(clear)
    assert (torch_logits.argmax(-1) == ct2_logits.argmax(-1))[clear].all()

    options = whisper.DecodingOptions(language="en", without_timestamps=True, fp16=False)
    torch_text = whisper.decode(converted, mel[0], options).text
    assert wer(tokenizer.decode(tokens), torch_text) <= 0.1  # equal but for a near tie's word
    assert wer(SECOND, torch_text) <= SCRIPT_WER


def test_conversion_is_cached_by_checksum(whisper_cache):
    model_dir = asr._ct2_dir(None)
    first = whisper_weights.convert(model_dir, whisper_cache)
    stamp = first.stat().st_mtime_ns
    assert whisper_weights.convert(model_dir, whisper_cache) == first and first.stat().st_mtime_ns == stamp
    checkpoint = torch.load(first, weights_only=True)
    assert checkpoint["dims"]["n_audio_layer"] == 4 and checkpoint["dims"]["n_vocab"] == 51864
    assert [1, 0] in checkpoint["alignment_heads"]
    assert isinstance(whisper.load_model(str(first)), whisper.model.Whisper)  # also a plain openai-whisper checkpoint


class _TinySpec(model_spec.ModelSpec):
    """A two-variable CTranslate2 model, written by ctranslate2's own serializer in each storage type."""

    def __init__(self):
        super().__init__()
        self.linear = common_spec.LinearSpec()
        self.conv = common_spec.Conv1DSpec()

    @property
    def name(self):
        return "TinySpec"


@pytest.mark.parametrize("quantization", ["float32", "float16", "bfloat16", "int16", "int8", "int8_float16"])
def test_reads_and_dequantizes_every_ctranslate2_storage_type(tmp_path, quantization):
    rng = np.random.default_rng(1)
    weight, conv = rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(6, 4, 3)).astype(np.float32)
    spec = _TinySpec()
    spec.linear.weight, spec.linear.bias = weight.copy(), np.arange(16, dtype=np.float32)
    spec.conv.weight, spec.conv.bias = conv.copy(), np.ones(6, dtype=np.float32)
    spec.validate()
    spec.optimize(quantization)
    spec._serialize(str(tmp_path / "model.bin"))

    name, _, variables = whisper_weights.read_ct2_variables(tmp_path / "model.bin")
    assert name == "TinySpec"
    for key, original in (("linear/weight", weight), ("conv/weight", conv)):
        restored = whisper_weights.dequantize(variables, key)
        assert restored.dtype == np.float32 and restored.shape == original.shape
        error = np.abs(restored - original).reshape(original.shape[0], -1)
        row_max = np.abs(original).reshape(original.shape[0], -1).max(axis=1, keepdims=True)
        bound = {  # half a quantization step, or the float format's relative precision
            "int8": row_max / 127 / 2,
            "int8_float16": row_max / 127 / 2,
            "int16": np.full_like(row_max, np.abs(original).max() / 2**10 / 2),
            "float16": np.abs(original).reshape(error.shape) * 2**-11,
            "bfloat16": np.abs(original).reshape(error.shape) * 2**-8,
            "float32": np.zeros_like(row_max),
        }[quantization]
        assert (error <= bound + 1e-7).all()
    np.testing.assert_array_equal(whisper_weights.dequantize(variables, "linear/bias"), np.arange(16))
    assert whisper_weights.read_ct2_shapes(tmp_path / "model.bin")["conv/weight"] == (6, 4, 3)


def test_get_transcriber_caches_and_validates(transcribers, tmp_path):
    assert get_transcriber(FASTER_WHISPER) is transcribers[FASTER_WHISPER]
    assert get_transcriber(None) is transcribers[asr.DEFAULT_BACKEND]
    with pytest.raises(ValueError, match="unknown ASR backend 'whisper-cpp'"):
        get_transcriber("whisper-cpp")
    with pytest.raises(ValueError, match="does not exist"):
        get_transcriber(FASTER_WHISPER, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"model\.bin is missing"):
        get_transcriber(OPENAI_WHISPER, str(tmp_path))
    (tmp_path / "tiny.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="needs a CTranslate2 Whisper directory"):
        get_transcriber(FASTER_WHISPER, str(tmp_path / "tiny.pt"))
    with pytest.raises(ValueError, match="expected mono samples"):
        transcribers[FASTER_WHISPER].transcribe(np.zeros((2, SAMPLE_RATE), dtype=np.float32))


def _encode(samples: np.ndarray, fmt: str, codec: str, rate: int = 48_000) -> bytes:
    """Re-encode 16 kHz mono samples as a browser would (48 kHz stereo Opus in WebM, say), with PyAV."""
    upsampled = np.interp(np.arange(len(samples) * rate // SAMPLE_RATE) * SAMPLE_RATE / rate,
                          np.arange(len(samples)), samples)  # fmt: skip
    pcm = (np.clip(upsampled, -1, 1) * 32767).astype(np.int16)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        for i in range(0, len(pcm), 960):
            block = np.repeat(pcm[i : i + 960], 2)[None, :]  # interleaved s16 stereo
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="stereo")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(("fmt", "codec"), [("webm", "libopus"), ("ogg", "libopus"), ("flac", "flac")])
def test_load_audio_decodes_browser_formats(speech, transcribers, fmt, codec):
    original = speech[FIRST]
    data = _encode(original, fmt, codec)
    decoded = load_audio(data)
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    assert abs(len(decoded) - len(original)) < 0.03 * SAMPLE_RATE
    if fmt == "webm":
        assert wer(FIRST, transcribers[FASTER_WHISPER].transcribe(decoded).text) <= SCRIPT_WER
        assert probe_duration(data) == pytest.approx(duration_seconds(original), abs=0.05)


def test_load_audio_keeps_what_a_truncated_recording_holds(speech):
    data = _encode(speech[SECOND], "webm", "libopus")
    decoded = load_audio(data[: len(data) // 2])
    assert 0.3 * len(speech[SECOND]) < len(decoded) < 0.7 * len(speech[SECOND])


def _video_only() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for _ in range(3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def test_load_audio_rejects_bad_input_with_a_useful_message(tmp_path, speech_files):
    (tmp_path / "empty.webm").write_bytes(b"")
    soundfile.write(tmp_path / "zero.wav", np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    cases = [
        (b"", "empty \\(0 bytes\\)"),
        (tmp_path / "empty.webm", "empty \\(0 bytes\\)"),
        (b"\x1a\x45\xdf\xa3 not really a webm file" * 20, "corrupt or not an audio/video file"),
        (tmp_path / "missing.wav", "does not exist"),
        (_video_only(), "no audio stream \\(it holds video\\)"),
        (tmp_path / "zero.wav", "no audio samples \\(zero length\\)"),
    ]
    for source, message in cases:
        with pytest.raises(AudioError, match=message):
            load_audio(source)
    with pytest.raises(AudioError, match=r"the limit is 1\.0 s"):
        load_audio(speech_files[FIRST], max_seconds=1.0)
    assert issubclass(AudioError, ValueError)
