"""Audio tracks of a capture: the microphone (sounddevice -> WAV) or a pre-recorded file. Each source says where its
time 0 falls on the events' clock (`offset`, written to session.json) so the pipeline can align speech to actions."""

from __future__ import annotations

import queue
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import AudioError
from .session import AUDIO_SUFFIXES

Clock = Callable[[], float]


class AudioSource(ABC):
    """One audio track. `start()` puts its file into the session directory and sets `file` and `offset` (seconds on
    the capture's clock at which the audio's time 0 falls); `stop()` finishes the file."""

    file: str | None = None
    offset: float | None = None
    error: BaseException | None = None

    def check(self) -> None:  # noqa: B027 - optional: fail before a session is created
        """Raise AudioError now if `start()` could not work (no device, missing file)."""

    @abstractmethod
    def start(self, directory: Path, clock: Clock) -> None: ...

    def pause(self) -> None:  # noqa: B027 - sources that cannot pause keep running
        """Capture nothing until resume() (the track keeps its length: silence in between)."""

    def resume(self) -> None:  # noqa: B027
        pass

    @abstractmethod
    def stop(self) -> None: ...


def align(written: int, expected: int, frames: int, tolerance: int) -> tuple[int, int]:
    """(silence to insert, samples to drop) before a block of `frames` samples that should start at sample `expected`
    of the file when `written` samples are already in it: a device clock that drifts from the events' clock, or
    buffers the driver lost, would otherwise shift every later word against the actions. Drift under `tolerance`
    samples is left alone."""
    drift = expected - written
    if drift > tolerance:
        return drift, 0
    if drift < -tolerance:
        return 0, min(-drift, frames)
    return 0, 0


class Microphone(AudioSource):
    """The microphone, through PortAudio (sounddevice), written as 16-bit WAV while it records."""

    def __init__(
        self,
        device: int | str | None = None,
        samplerate: int | None = None,
        channels: int = 1,
        *,
        filename: str = "audio.wav",
        max_drift_s: float = 0.04,
    ) -> None:
        self.device, self.samplerate, self.channels = device, samplerate, channels
        self.filename, self.max_drift_s = filename, max_drift_s
        self._paused = False
        self._queue: queue.Queue[tuple[float, Any, int] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._stream: Any = None
        self._sound: Any = None

    def check(self) -> dict[str, Any]:
        """The input device's description, or an AudioError saying there is none and what to do instead."""
        try:
            import sounddevice
        except OSError as exc:  # PortAudio itself is missing
            raise AudioError(f"cannot use the microphone: {exc} (install PortAudio, or use --audio-file)") from exc
        try:
            info = sounddevice.query_devices(self.device, kind="input")
        except (sounddevice.PortAudioError, ValueError) as exc:
            what = f"input device {self.device!r}" if self.device is not None else "microphone"
            raise AudioError(
                f"no {what} found ({exc}); connect one, pick another with --audio-device "
                "(see `python -m sounddevice`), or record with --audio-file FILE or --no-audio"
            ) from exc
        if int(info.get("max_input_channels", 0)) < 1:
            raise AudioError(f"device {info.get('name')!r} has no input channels; pick another with --audio-device")
        return dict(info)

    def start(self, directory: Path, clock: Clock) -> None:
        import sounddevice

        info = self.check()
        rate = int(self.samplerate or info.get("default_samplerate") or 48000)
        channels = max(1, min(self.channels, int(info["max_input_channels"])))
        self._open(directory, clock, rate, channels)
        try:
            self._stream = sounddevice.InputStream(
                device=self.device,
                samplerate=rate,
                channels=channels,
                dtype="int16",
                blocksize=rate // 20,  # 50 ms blocks
                callback=self._callback,
            )
            self._stream.start()
        except Exception as exc:
            self.stop()
            raise AudioError(f"cannot record from the microphone: {exc}") from exc

    def _open(self, directory: Path, clock: Clock, rate: int, channels: int) -> None:
        """The WAV file and its writer thread, fed by `_callback` (PortAudio's thread) through a queue."""
        import soundfile

        self._clock, self.rate = clock, rate
        self.file = self.filename
        self._sound = soundfile.SoundFile(
            str(directory / self.filename), "w", samplerate=rate, channels=channels, subtype="PCM_16"
        )
        self._written = 0
        self._tolerance = int(self.max_drift_s * rate)
        self.offset = clock()  # until the first block says when its first sample was taken
        self._first = True
        self._writer = threading.Thread(target=self._write, name="audio-writer", daemon=True)
        self._writer.start()

    def _callback(self, indata: Any, frames: int, time_info: Any, status: Any) -> None:
        now = self._clock()
        latency = float(time_info.currentTime) - float(time_info.inputBufferAdcTime)
        if not (time_info.inputBufferAdcTime > 0 and 0.0 <= latency < 1.0):
            latency = frames / self.rate
        self._queue.put((now - latency, None if self._paused else indata.copy(), frames))

    def _write(self) -> None:
        import numpy as np

        while (item := self._queue.get()) is not None:
            block_start, data, frames = item
            if self._first:
                self.offset, self._first = block_start, False
            expected = round((block_start - (self.offset or 0.0)) * self.rate)
            pad, drop = align(self._written, expected, frames, self._tolerance)
            channels = self._sound.channels
            try:
                if pad:
                    self._sound.write(np.zeros((pad, channels), dtype="int16"))
                if data is None:
                    data = np.zeros((frames, channels), dtype="int16")
                data = data[drop:]
                self._sound.write(data)
                self._written += pad + len(data)
            except Exception as exc:
                self.error = exc
                return

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def stop(self) -> None:
        if self._stream is not None:
            try:
                self._stream.stop()
                self._stream.close()
            except Exception:
                pass
            self._stream = None
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(10.0)
            self._writer = None
        if self._sound is not None:
            self._sound.close()
            self._sound = None


class FileAudio(AudioSource):
    """A pre-recorded file as the audio track (an alternative input, and what tests use). WAV, FLAC, Ogg and WebM are
    copied as they are; anything else soundfile reads (e.g. MP3, AIFF) is converted to WAV. Its time 0 falls at
    `offset` on the capture's clock, by default the moment the capture started its audio."""

    def __init__(self, path: Path | str, offset: float | None = None) -> None:
        self.path = Path(path)
        self._offset = offset

    def check(self) -> None:
        if not self.path.is_file():
            raise AudioError(f"audio file {self.path} does not exist")
        if self.path.suffix.lower() not in AUDIO_SUFFIXES:
            try:
                import soundfile

                soundfile.info(str(self.path))
            except Exception as exc:
                raise AudioError(f"cannot read audio file {self.path}: {exc}") from exc

    def start(self, directory: Path, clock: Clock) -> None:
        self.check()
        self.offset = self._offset if self._offset is not None else clock()
        suffix = self.path.suffix.lower()
        try:
            if suffix in AUDIO_SUFFIXES:
                self.file = f"audio{suffix}"
                shutil.copyfile(self.path, directory / self.file)
            else:
                self.file = "audio.wav"
                _convert_to_wav(self.path, directory / self.file)
        except Exception as exc:
            raise AudioError(f"cannot copy audio file {self.path}: {exc}") from exc

    def stop(self) -> None:
        pass


def _convert_to_wav(source: Path, target: Path) -> None:
    import soundfile

    with soundfile.SoundFile(str(source)) as reader:
        with soundfile.SoundFile(
            str(target), "w", samplerate=reader.samplerate, channels=reader.channels, subtype="PCM_16"
        ) as writer:
            for block in reader.blocks(blocksize=65536, dtype="int16", always_2d=True):
                writer.write(block)
