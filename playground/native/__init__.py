"""Native CPU kernels, compiled on first use for the machine they run on.

Fused kernels, tiled so that each tile's probabilities stay in cache between the
products, which whole-block torch operations cannot do:
- `hankel_backward.cpp`: the backward of `kernels.hankel_biased_attention` (learned
  relative biases: T5, learnable ALiBi, any `relative_score_mod`), with the bias gradient;
- `blocked_attention.cpp`: the forward and backward of blocks of queries each over its own
  span of keys (`kernels.blocked_attention`: mask_mod windows; `kernels.banded_attention`:
  Longformer), adding each span's key and value gradients in place, with nothing
  span-sized to zero.

They are optional. Without a C++ compiler, or with PLAYGROUND_NATIVE=0, torch's flash
kernel and the Python backwards in `playground.kernels` run instead, with the same
results; `status()` says which runs and why.

The build uses torch's own extension machinery (`torch.utils.cpp_extension.load`, which
needs ninja) into torch's extensions cache, with -march=native: it is built where it runs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("module.cpp", "hankel_backward.cpp", "blocked_attention.cpp")
)
HEADERS = (Path(__file__).with_name("native.h"),)
DISABLE_VARIABLE = "PLAYGROUND_NATIVE"


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native kernels are in use, and if not, why."""

    available: bool
    reason: str


_module: ModuleType | None = None
_status: NativeStatus | None = None


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    # The name carries the machine (a shared home directory's cache must not hand one
    # CPU's -march=native build to another) and the sources' hash (torch rebuilds when a
    # source changes, but not when only the header does).
    name = f"playground_native_{platform.machine()}_{_cpu_signature()}_{_source_signature()}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cpp_extension.load(
            name=name,
            sources=[str(path) for path in SOURCES],
            extra_cflags=["-O3", "-march=native", "-fno-trapping-math", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )


def _cpu_signature() -> str:
    """A short hash of this CPU's model and flags (Linux), else of platform.processor()."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
        key = "\n".join(sorted(set(lines)))
    except OSError:
        key = platform.processor()
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def _source_signature() -> str:
    """A short hash of the native sources and headers."""
    digest = hashlib.sha1()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def load() -> ModuleType | None:
    """The compiled module, built on the first call; None when it cannot be had (see
    `status()`). Later calls return the first call's answer."""
    global _module, _status
    if _status is not None:
        return _module
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        _status = NativeStatus(False, f"disabled by {DISABLE_VARIABLE}=0")
        return None
    try:
        _module = _build()
        _status = NativeStatus(True, f"built from {', '.join(path.name for path in SOURCES)}")
    except Exception as error:  # no compiler, no ninja, a failed build: the Python path runs
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        _status = NativeStatus(False, f"build failed: {type(error).__name__}: {first_line}")
        warnings.warn(
            f"playground.native could not be built ({_status.reason}); variants with a "
            f"learned relative bias, a band or a mask_mod run on the slower flash kernel "
            f"and Python backwards, with the same results. Install a C++ compiler and "
            f"ninja for the fast ones, or set {DISABLE_VARIABLE}=0 to use the Python "
            f"paths without this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    return _module


def status() -> NativeStatus:
    """Whether the native kernels are in use (building them if not yet tried)."""
    load()
    assert _status is not None
    return _status
