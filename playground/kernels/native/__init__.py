"""Native CPU kernels, compiled on first use for the machine they run on.

Fused kernels, tiled so that each tile's probabilities stay in cache between the
products, which whole-block torch operations cannot do:
- `hankel_backward.cpp`: the backward of `kernels.hankel_biased_attention` (learned
  relative biases: T5, learnable ALiBi, any `relative_score_mod`), with the bias gradient;
- `blocked_attention.cpp`: the forward and backward of blocks of queries each over its own
  span of keys (`kernels.blocked_attention`: mask_mod windows; `kernels.banded_attention`:
  Longformer), adding each span's key and value gradients in place, with nothing
  span-sized to zero.

They are optional. Without a C++ compiler, or with PLAYGROUND_NATIVE=0 (or false, no,
off), torch's flash kernel and the Python backwards in `playground.kernels` run instead,
with the same results; `build_state()` says which runs and why.

The build uses torch's own extension machinery (`torch.utils.cpp_extension.load`, which
needs ninja) with -march=native: it is built where it runs. Its directory, under torch's
extensions cache (TORCH_EXTENSIONS_DIR moves it), is named after what the build depends
on: the machine, the sources and the torch installation (torch's version and path, the
Python prefix, the compiler and its flags), so that two environments never rebuild each
other's. A finished build leaves a marker holding the library's size and hash; a library
that does not match it (a killed build, a truncated file) is never imported, since loading
a damaged shared library kills the process, but rebuilt. A build says so on stderr while it
runs, and `prepare()` lets a caller build before it starts timing anything. One process
builds at a time (an flock, which dies with its holder); another waits for it, for a
bounded time. torch's own `lock` file, which a killed build leaves behind and on which
torch would wait forever, is never waited on: a warning names it and the Python paths run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension

from playground.errors import ConfigError

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: torch's own build lock is all there is
    fcntl = None

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("module.cpp", "hankel_backward.cpp", "blocked_attention.cpp")
)
PROGRAM_HEADER = Path(__file__).parents[2] / "mods" / "program.h"
"""The interpreter of mod programs, which `blocked_attention.cpp` includes: it lives with the
compiler that writes the programs (`playground.mods`), so that an opcode changes in one
folder; this library is built from both."""
HEADERS = (Path(__file__).with_name("native.h"), PROGRAM_HEADER)
DISABLE_VARIABLE = "PLAYGROUND_NATIVE"
OFF_VALUES = ("0", "false", "no", "off")
ON_VALUES = ("1", "true", "yes", "on")
CFLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp")
LDFLAGS = ("-fopenmp",)
LOCK_WAIT_S = 300.0
"""How long to wait for another process's build before taking the Python paths: a build
takes a minute or two, so one that holds the lock much longer is stuck."""
LOCK_POLL_S = 0.5


@dataclass(frozen=True)
class BuildState:
    """Whether the native kernels are in use, and if not, why."""

    available: bool
    reason: str


_module: ModuleType | None = None
_build_state: BuildState | None = None


def enabled() -> bool:
    """Whether PLAYGROUND_NATIVE allows the native kernels (unset or empty: yes). A value
    that is neither on nor off is refused rather than guessed: a typo for "off" must not
    leave the kernels on in silence."""
    value = os.environ.get(DISABLE_VARIABLE, "").strip().lower()
    if value in ("", *ON_VALUES):
        return True
    if value in OFF_VALUES:
        return False
    raise ConfigError(
        f"{DISABLE_VARIABLE}={os.environ[DISABLE_VARIABLE]!r} is neither on nor off; set it "
        f"to one of {', '.join(OFF_VALUES)} to use the Python paths, or one of "
        f"{', '.join(ON_VALUES)} (or unset it) for the native kernels"
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


def _torch_signature() -> str:
    """A short hash of the torch installation the library links against and of how it is
    compiled: torch's build.ninja holds absolute paths into one environment, so two
    environments sharing one directory would rebuild it in turn."""
    key = [
        torch.__version__,
        str(Path(torch.__file__).resolve().parent),
        sys.prefix,
        sys.version,
        os.environ.get("CXX", "c++"),
        *CFLAGS,
        *LDFLAGS,
    ]
    return hashlib.sha1("\n".join(key).encode()).hexdigest()[:8]


def module_name() -> str:
    """The extension's name: it carries everything the build depends on. The machine (a
    shared home directory's cache must not hand one CPU's -march=native build to another),
    the sources' hash (torch rebuilds when a source changes, but not when only the header
    does) and the torch installation's."""
    return (
        f"playground_native_{platform.machine()}_{_cpu_signature()}_{_source_signature()}"
        f"_{_torch_signature()}"
    )


def build_directory() -> Path:
    """Where the library is built: its own directory under torch's extensions cache."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / module_name()


def _library(directory: Path) -> Path:
    return directory / f"{directory.name}.so"


def _marker(directory: Path) -> Path:
    return directory / "playground-build.json"


def _fingerprint(library: Path) -> dict[str, object]:
    return {
        "size": library.stat().st_size,
        "sha256": hashlib.sha256(library.read_bytes()).hexdigest(),
    }


def _finished(directory: Path) -> bool:
    """Whether the library is there, whole: as the build that finished left it."""
    library, marker = _library(directory), _marker(directory)
    try:
        return json.loads(marker.read_text()) == _fingerprint(library)
    except (OSError, ValueError):
        return False


def _import(directory: Path) -> ModuleType:
    """Import the finished library (only one `_finished` vouches for)."""
    spec = importlib.util.spec_from_file_location(directory.name, _library(directory))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(directory: Path) -> ModuleType:
    """Build the library into `directory` with torch's machinery and import it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on the compiler's ABI and ninja
        return cpp_extension.load(
            name=directory.name,
            sources=[str(path) for path in SOURCES],
            extra_include_paths=[str(Path(__file__).parent), str(PROGRAM_HEADER.parent)],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(directory),
            verbose=False,
        )


class StaleLock(RuntimeError):
    """A build lock stands and nobody is building: a killed build left it."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _building(directory: Path) -> Iterator[None]:
    """Hold the right to build into `directory`, waiting (saying so) while another process
    holds it, for LOCK_WAIT_S at most. The lock is an flock on a file beside the
    directory: the system releases it when its holder dies, so a killed build leaves no
    lock of ours behind (torch's `lock` file it does leave; `_build` handles that)."""
    if fcntl is None:  # not POSIX: torch's own lock is all there is
        yield
        return
    path = directory.with_name(f"{directory.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        waited_since, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - waited_since
                if waited >= LOCK_WAIT_S:
                    raise StaleLock(
                        f"another process has been building playground.kernels.native for over "
                        f"{waited:.0f} s (it holds {path}); let it finish, or end it"
                    ) from None
                if not said:
                    _say(
                        "waiting for another process's build of playground.kernels.native "
                        f"({path})..."
                    )
                    said = True
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build() -> ModuleType:
    """The library: imported when a finished build is there, else built (saying so)."""
    directory = build_directory()
    if _finished(directory):
        return _import(directory)
    with _building(directory):
        if _finished(directory):  # another process built it while this one waited
            return _import(directory)
        lock = directory / "lock"
        if lock.exists():
            # torch waits on its lock with no end; no process of ours is building (this
            # one holds the build lock), so a build that was killed left it.
            raise StaleLock(
                f"the build lock {lock} was left by a build that was killed (no build is "
                f"running); remove it (rm {lock}) and the next run builds again"
            )
        if directory.exists():  # what a killed build or a damaged library left: afresh
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        _say("building playground.kernels.native (first use, about a minute)...")
        started = time.monotonic()
        module = _compile(directory)
        _marker(directory).write_text(json.dumps(_fingerprint(_library(directory))))
        _say(f"built playground.kernels.native in {time.monotonic() - started:.0f} s ({directory})")
        return module


def load() -> ModuleType | None:
    """The compiled module, built on the first call; None when it cannot be had (see
    `build_state()`). Later calls return the first call's answer. ConfigError when
    PLAYGROUND_NATIVE is neither on nor off."""
    global _module, _build_state
    if _build_state is not None:
        return _module
    if not enabled():
        value = os.environ[DISABLE_VARIABLE]
        _build_state = BuildState(False, f"disabled by {DISABLE_VARIABLE}={value}")
        return None
    try:
        _module = _build()
        _build_state = BuildState(True, f"built from {', '.join(path.name for path in SOURCES)}")
    except Exception as error:  # no compiler, no ninja, a failed build: the Python path runs
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        _build_state = BuildState(False, f"build failed: {type(error).__name__}: {first_line}")
        warnings.warn(
            f"playground.kernels.native could not be built ({_build_state.reason}); variants "
            f"with a learned relative bias, a band or a mask_mod run on the slower flash kernel "
            f"and Python backwards, with the same results. Install a C++ compiler and "
            f"ninja for the fast ones, or set {DISABLE_VARIABLE}=0 to use the Python "
            f"paths without this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
    return _module


def build_state() -> BuildState:
    """Whether the native kernels are in use, building or loading them if not yet tried:
    call it before timing anything, so that a build never lands inside a measurement (it
    is quick once built)."""
    load()
    assert _build_state is not None
    return _build_state
