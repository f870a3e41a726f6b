"""Server-side processing of think-aloud captures: audio decoding, speech recognition, alignment to actions."""
