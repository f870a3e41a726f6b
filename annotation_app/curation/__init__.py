"""Curation of the trajectory store: executability verification by replay, near-duplicate grouping, flags."""
