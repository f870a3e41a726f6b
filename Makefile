# Shortcuts for the project's scripts (the scripts themselves need nothing but bash and Python).
.PHONY: run test services-start services-stop lint bench

run:
	./scripts/run
test:
	./scripts/test
services-start:
	./scripts/services start
services-stop:
	./scripts/services stop
lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
bench:
	.venv/bin/python bench/queue_load.py
