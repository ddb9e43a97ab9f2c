"""The release gates that `nox -s bench_compare` and `nox -s bench` run: the time gate
(paired rounds on the baseline's commit and the working tree), the exact memory gate, and
the check that a saved run measured something.

    python -m playground.gates.time .benchmarks --candidate run.json
    python -m playground.gates.memory .benchmarks --candidate run.json
    python -m playground.gates.measured --role baseline RUN.json

Importable without pytest: the benchmark suite (tests/benchmarks) builds its timed calls
with calls.py, and its conftest turns this package's PlaygroundErrors into pytest's usage
errors.
"""
