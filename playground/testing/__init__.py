"""The contract suite every variant must pass, usable by third-party plugin authors.

    from playground.testing import check_attention, parametrize_with_checks

    report = check_attention("vanilla")          # runs every check, returns the report
    assert report.ok, report.failures

    @parametrize_with_checks(["my_variant"])     # one pytest test per (variant, impl, check)
    def test_contract(case):
        case.check()                              # pytest -k causality selects by name

Checks run for `impl="fast"` and, when the variant has a fast path, for
`impl="reference"` too; `check_fast_matches_reference` compares the two once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from playground.contract import AttentionVariant
from playground.registry import Registry, default_registry
from playground.testing.checks import CHECKS, IMPL_INDEPENDENT
from playground.testing.corners import CheckFailed, CheckSkipped
from playground.testing.properties import property_search
from playground.testing.subject import Subject, resolve_variant

if TYPE_CHECKING:
    import pytest

Verdict = Literal["passed", "failed", "skipped"]
"""A check's outcome (a row's outcome is its `status`)."""


@dataclass(frozen=True)
class CheckResult:
    variant: str
    impl: str
    check: str
    verdict: Verdict
    reason: str = ""
    seconds: float = 0.0


@dataclass
class CheckReport:
    """The results of `check_attention` for one variant."""

    variant: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.verdict == "failed"]

    def verdict_of(self, check: str, impl: str = "fast") -> Verdict:
        """The verdict on one check, e.g. `report.verdict_of("check_causality")`."""
        for result in self.results:
            if result.check == check and result.impl == impl:
                return result.verdict
        raise KeyError(f"{check} did not run for impl={impl!r}")


@dataclass(frozen=True)
class CheckCase:
    """One (variant, impl, check) to evaluate; pytest ids are `variant-impl-check_name`.

    `function` is the named check (one of CHECKS); `check()` applies it inside pytest."""

    variant: type[AttentionVariant]
    impl: str
    function: Callable[[Subject], None]
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.variant.name}-{self.impl}-{self.function.__name__}"

    def evaluate(self) -> CheckResult:
        """Run the check and return its result (never raises for a failed check)."""
        start = time.perf_counter()
        threads = torch.get_num_threads()
        # The suite's tensors are small: one thread runs them fastest, and other jobs on
        # the machine slow it least.
        torch.set_num_threads(1)
        verdict: Verdict
        try:
            self.function(Subject(self.variant, impl=self.impl, options=dict(self.options)))
        except CheckSkipped as skipped:
            verdict, reason = "skipped", str(skipped)
        except CheckFailed as failed:
            verdict, reason = "failed", str(failed)
        except Exception as error:  # a crash is a failure of the variant, reported as such
            verdict, reason = "failed", f"raised {type(error).__name__}: {error}"
        else:
            verdict, reason = "passed", ""
        finally:
            torch.set_num_threads(threads)
        return CheckResult(
            self.variant.name,
            self.impl,
            self.function.__name__,
            verdict,
            reason,
            time.perf_counter() - start,
        )

    def check(self) -> None:
        """Check inside pytest: a failure fails the test, a skip skips it with its reason."""
        import pytest

        result = self.evaluate()
        if result.verdict == "skipped":
            pytest.skip(result.reason)
        if result.verdict == "failed":
            pytest.fail(f"{self.id}: {result.reason}", pytrace=False)


def iter_cases(
    variants: Iterable[str | type[AttentionVariant]] | None = None,
    checks: Sequence[Callable[[Subject], None]] = CHECKS,
    registry: Registry | None = None,
    options: dict[str, Any] | None = None,
) -> Iterator[CheckCase]:
    """Every (variant, impl, check) case; `variants=None` means every registered one."""
    if variants is None:
        registry = registry or default_registry()
        variants = registry.names()
    frozen_options = tuple(sorted((options or {}).items()))
    for variant in variants:
        cls = resolve_variant(variant, registry)
        impls = ("fast", "reference") if cls.forward_fast is not None else ("fast",)
        for impl in impls:
            for check in checks:
                if impl == "reference" and check in IMPL_INDEPENDENT:
                    continue
                yield CheckCase(cls, impl, check, frozen_options)


def check_attention(
    variant: str | type[AttentionVariant],
    checks: Sequence[Callable[[Subject], None]] = CHECKS,
    registry: Registry | None = None,
    options: dict[str, Any] | None = None,
) -> CheckReport:
    """Run the contract suite on one variant (a registered name or a class)."""
    cls = resolve_variant(variant, registry)
    report = CheckReport(cls.name)
    for case in iter_cases([cls], checks, options=options):
        report.results.append(case.evaluate())
    return report


def parametrize_with_checks(
    variants: Iterable[str | type[AttentionVariant]] | None = None,
    checks: Sequence[Callable[[Subject], None]] = CHECKS,
    registry: Registry | None = None,
) -> pytest.MarkDecorator:
    """A pytest parametrize mark over (variant, impl, check) cases, argument `case`."""
    import pytest

    cases = list(iter_cases(variants, checks, registry))
    return pytest.mark.parametrize("case", cases, ids=[case.id for case in cases])


__all__ = [
    "CHECKS",
    "CheckCase",
    "CheckFailed",
    "CheckReport",
    "CheckResult",
    "CheckSkipped",
    "Subject",
    "check_attention",
    "iter_cases",
    "parametrize_with_checks",
    "property_search",
    "resolve_variant",
]
