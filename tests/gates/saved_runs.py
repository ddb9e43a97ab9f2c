"""Synthetic saved runs in pytest-benchmark's storage layout, for the tests of the
memory and time gates and of the history plot."""

from __future__ import annotations

import json
from pathlib import Path

MACHINE = "Linux-CPython-3.11-64bit"
MACHINE_INFO = {
    "system": "Linux",
    "machine": "x86_64",
    "torch_version": "2.13.0",
    "torch_threads": 2,
    "device": "cpu",
    "device_name": "AMD EPYC",
}


def save_run(
    storage: Path,
    number: int,
    peaks: dict[str, int],
    medians_s: dict[str, float] | None = None,
    machine: str = MACHINE,
    mins_s: dict[str, float] | None = None,
    reference_s: float = 0.005,
    threads: int = 2,
    **machine_info: object,
) -> Path:
    """A saved run as `--benchmark-autosave` writes it, with the fields the gates read:
    each benchmark's fastest round (`mins_s`, default 1 ms) and the reference matmul timed
    before each of its rounds (fastest `reference_s`, and as much slower as each round)."""
    benchmarks = []
    for name, peak in peaks.items():
        variant, n, pass_name = name.split("-")
        fastest = (mins_s or {}).get(name, 0.001)
        benchmarks.append(
            {
                "name": f"test_attention[{name}]",
                "fullname": f"tests/benchmarks/test_attention_benchmarks.py::test_attention[{name}]",
                "group": f"seq_len={n[1:]}",
                "params": {"variant": variant, "seq_len": int(n[1:]), "pass_name": pass_name},
                "extra_info": {
                    "variant": variant,
                    "seq_len": int(n[1:]),
                    "pass_name": pass_name,
                    "peak_memory_bytes": peak,
                    "threads": threads,
                    # three rounds, each as loaded as the reference timed before it
                    "round_times_s": [fastest * 1.2, fastest, fastest * 1.1],
                    "reference_times_s": [reference_s * 1.2, reference_s, reference_s * 1.1],
                },
                "stats": {
                    "median": (medians_s or {}).get(name, 0.001),
                    "min": fastest,
                },
            }
        )
    path = storage / machine / f"{number:04d}_abcdef0123_20260101_00000{number}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "machine_info": {**MACHINE_INFO, **machine_info},
        "commit_info": {"id": "abcdef0123", "dirty": False},
        "benchmarks": benchmarks,
        "datetime": f"2026-01-01T00:00:0{number}+00:00",
        "version": "5.3.1",
    }
    path.write_text(json.dumps(data))
    return path
