"""The data flywheel: model registry now; validation, CT/SFT stores, iterations and exports build on it."""
