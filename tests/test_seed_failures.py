"""`errors.first_seed_failure`: what a row of several seeds says when one of them failed,
the one rule the accuracy, language and packed rows share."""

from __future__ import annotations

from playground.errors import first_seed_failure


def test_the_first_failed_seed_in_order_speaks_for_the_row():
    unsupported = {"status": "unsupported", "error": "no 512 tokens"}
    broken = {"status": "error", "error": "RuntimeError: boom"}
    found = first_seed_failure([(0, None), (3, unsupported), (1, broken)])
    assert found == {"status": "unsupported", "error": "seed 3: no 512 tokens"}
    assert unsupported["error"] == "no 512 tokens"  # the seed's own record is left alone


def test_no_failure_when_every_seed_succeeded():
    assert first_seed_failure([(0, None), (1, None)]) is None
    assert first_seed_failure([]) is None
