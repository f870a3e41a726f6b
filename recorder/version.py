"""The recorder's version, as written into session.json (`recorder`) and the User-Agent of its requests."""

__version__ = "0.1.0"
RECORDER = f"thinkaloud-recorder {__version__}"
