"""Synthetic saved runs in pytest-benchmark's storage layout, for the tests of the
memory gate and of the history plot."""

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
    **machine_info: object,
) -> Path:
    """A saved run as `--benchmark-autosave` writes it, with the fields the gate reads."""
    benchmarks = []
    for name, peak in peaks.items():
        variant, n, pass_name = name.split("-")
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
                },
                "stats": {"median": (medians_s or {}).get(name, 0.001), "min": 0.001},
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
