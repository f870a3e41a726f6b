"""Perceptual hashes of screenshots (ImageHash's pHash, 64 bits) and their Hamming distance: the comparison that
executability replays and deduplication share. Size- and encoding-independent, so a JPEG the model saw and a PNG
the recorder kept of the same screen hash alike."""

from __future__ import annotations

import io

import imagehash
from PIL import Image

BITS = 64  # pHash with hash_size 8
DRAFT = (128, 128)  # JPEGs are decoded at a reduced scale: pHash looks at 32x32 anyway


def phash(data: bytes) -> str:
    """The pHash of an encoded image, as 16 hex digits; ValueError when `data` is not an image."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("L", DRAFT)  # a no-op for formats other than JPEG
            return str(imagehash.phash(image.convert("L")))
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"not a readable image: {exc}") from exc


def distance(a: str, b: str) -> int:
    """Bits that differ between two hex hashes (0 = the same picture, 64 = opposites)."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
