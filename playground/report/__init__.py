"""What a run directory shows: the summary (`summary`), figures (`plots`), report.html and
report.md (`pages`), and the benchmark history (`bench_history`)."""
