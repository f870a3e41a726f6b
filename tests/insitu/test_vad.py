"""What Whisper decodes and where words land: speech regions merged and padded, word times snapped to the speech."""

import numpy as np

from annotation_app.insitu.asr import VadSettings, Word, _snap_to_speech, speech_windows
from annotation_app.insitu.audio import SAMPLE_RATE

S = SAMPLE_RATE


def region(start_s: float, end_s: float) -> dict[str, int]:
    return {"start": int(start_s * S), "end": int(end_s * S)}


def seconds(windows) -> list[list[tuple[float, float]]]:
    return [[(r["start"] / S, r["end"] / S) for r in window] for window in windows]


def test_short_pauses_merge_long_ones_split_and_padding_never_crosses_a_neighbour():
    audio = np.zeros(60 * S, dtype=np.float32)
    vad = VadSettings(min_silence_duration_ms=2000, speech_pad_ms=200)
    fine = [region(1.0, 2.0), region(2.5, 3.0), region(5.2, 6.0), region(6.1 + 2.0, 9.0), region(59.9, 60.0)]
    # 1.0-3.0 merged (0.5 s pause), 5.2-6.0 alone (2.2 s before it), 8.1-9.0 alone (2.1 s pause), 59.9-60 at the end
    assert seconds(speech_windows(audio, vad, fine)) == [[(0.8, 3.2), (5.0, 6.2), (7.9, 9.2), (59.7, 60.0)]]
    close = [region(1.0, 2.0), region(2.3, 3.0)]  # 0.3 s apart and not merged: the pads meet in the middle
    assert seconds(speech_windows(audio, VadSettings(min_silence_duration_ms=100, speech_pad_ms=200), close)) == [
        [(0.8, 2.15), (2.15, 3.2)]
    ]


def test_windows_hold_at_most_thirty_seconds_and_merging_stops_there():
    audio = np.zeros(120 * S, dtype=np.float32)
    fine = [region(t, t + 9.5) for t in range(0, 100, 10)]  # 9.5 s of speech every 10 s: every pause 0.5 s
    windows = speech_windows(audio, VadSettings(speech_pad_ms=0), fine)
    assert all(sum(r["end"] - r["start"] for r in w) <= 30 * S for w in windows)
    assert windows[0][0] == region(0, 29.5)  # three regions merged, not a fourth


def test_word_times_in_pauses_move_onto_the_speech_next_to_them():
    speech = [region(1.0, 2.0), region(3.0, 4.0)]
    early = Word("I", 0.6, 1.2, 0.9)  # starts in the padding before the speech
    stretched = Word("first", 1.8, 2.9, 0.9)  # ends deep in the pause after its sentence
    inside = Word("menu", 3.2, 3.5, 0.9)
    lost = Word("uh", 2.3, 2.5, 0.2)  # wholly in a pause: nothing to snap to, left alone
    _snap_to_speech([early, stretched, inside, lost], speech)
    assert (early.start, early.end) == (1.0, 1.2)
    assert (stretched.start, stretched.end) == (1.8, 2.0)
    assert (inside.start, inside.end) == (3.2, 3.5)
    assert (lost.start, lost.end) == (2.3, 2.5)
