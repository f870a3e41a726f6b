"""The sandbox platform: environments that execute UI-TARS actions. Plain Python: it never imports Django."""
