"""The in-situ think-aloud recorder: captures screen, input events and the microphone on the annotator's own computer
(or, as a library, on a sandbox's X display) in the capture format of docs/in-situ.md, and uploads it resumably."""

from .audio import AudioSource, FileAudio, Microphone
from .capture import Capture
from .errors import RecorderError
from .session import Session
from .version import RECORDER, __version__

__all__ = ["RECORDER", "AudioSource", "Capture", "FileAudio", "Microphone", "RecorderError", "Session", "__version__"]
