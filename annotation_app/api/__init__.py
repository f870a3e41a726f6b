"""The REST API (DRF): tasks, the annotation queue, trajectories and their steps, recordings and reviews."""
