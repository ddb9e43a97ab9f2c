"""nox sessions. The environments reuse the interpreter's site-packages, so PyTorch (a
multi-GB install) comes from the environment nox runs in and is never reinstalled: install
torch and `pip install -e ".[dev]"` once (see README), then sessions start in seconds."""

from __future__ import annotations

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

VENV = {"venv_params": ["--system-site-packages"], "reuse_venv": True}


def install_project(session: nox.Session) -> None:
    try:
        session.run("python", "-c", "import torch", silent=True)
    except nox.command.CommandFailed:
        session.error(
            "PyTorch is not importable: install the build for your platform in the "
            "environment that runs nox (the CPU build is enough), e.g. `pip install torch`"
        )
    session.install("-e", ".[dev]")


@nox.session(**VENV)
def tests(session: nox.Session) -> None:
    """The whole test suite (the README's test command)."""
    install_project(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs)
