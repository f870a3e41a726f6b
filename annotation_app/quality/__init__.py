"""Quality dashboards for data leads: precomputed per-annotator, per-model and coverage aggregates (/lead/quality/)."""
