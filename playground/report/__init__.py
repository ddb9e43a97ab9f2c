"""What a run directory shows: the summary lines and summary.csv (`summary`), the terminal
tables (`tables`), figures (`plots`), report.html and report.md (`pages`), and the benchmark
history (`bench_history`)."""
