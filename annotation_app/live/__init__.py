"""Live interactive annotation: sessions (leases, proposals, steps, ending with the evaluator), its pages, its REST API
and its Celery tasks."""
