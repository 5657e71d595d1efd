"""The project's benchmark tool: `python -m benchmarks <command>` (benchmarks/__main__.py)."""
