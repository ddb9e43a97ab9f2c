"""What the CPU is, from /proc/cpuinfo (Linux); empty answers elsewhere."""

from __future__ import annotations

from pathlib import Path


def cpuinfo_field(key: str) -> str:
    """The value of the first `key : value` line of /proc/cpuinfo ("model name",
    "vendor_id", …), or "" when there is none or no such file."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return ""
