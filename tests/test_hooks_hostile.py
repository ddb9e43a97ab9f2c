"""Hostile hooks (issue 30, §4): a hook that raises, returns junk or never ends is refused
at registration where it is static, and reported naming the variant, its file and the hook
where it is called; it never hangs the suite, is never dropped silently and is never
printed as a fact."""

from __future__ import annotations

import itertools

import numpy
import pytest
import torch

import playground
from playground.errors import HookError
from playground.hook_calls import (
    MAX_SPECIAL_SIZES,
    checked_logit_bias,
    checked_options_hook,
    checked_pattern_weights,
    checked_share_with_first_layer,
    checked_special_sizes,
)
from playground.registry import Registry
from playground.testing import check_attention
from playground.testing.checks import check_output_shape_and_dtype
from playground.testing.subject import Subject

Vanilla = playground.get_variant("vanilla")


def hostile(hook: str, behaviour, *, static: bool = False) -> type:
    """A vanilla subclass whose `hook` is replaced by `behaviour`."""
    attributes = {"name": f"hostile_{hook}", hook: staticmethod(behaviour) if static else behaviour}
    return type(f"Hostile_{hook}", (Vanilla,), attributes)


def _raise(*_):
    raise RuntimeError("boom")


# --- special_sizes ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        (lambda self: itertools.count(1), f"more than {MAX_SPECIAL_SIZES} sizes"),
        (lambda self: None, "returned None"),
        (lambda self: "32", "returned '32'"),
        (lambda self: (32.0,), "write 32"),
        (lambda self: (16, "wide"), "'wide' (str)"),
        (lambda self: (0,), "returned 0"),
        (lambda self: (True,), "True (bool)"),
        (_raise, "raised RuntimeError: boom"),
    ],
    ids=["endless", "none", "string", "float", "junk", "zero", "bool", "raises"],
)
def test_special_sizes_junk_is_a_hook_error_naming_variant_and_hook(behaviour, words):
    cls = hostile("special_sizes", behaviour)
    module = cls(32, 4)
    with pytest.raises(HookError) as raised:
        checked_special_sizes(module)
    message = str(raised.value)
    assert "'hostile_special_sizes'" in message and "special_sizes()" in message
    assert __file__ in message  # the file that defines the class
    assert words in message


def test_endless_special_sizes_does_not_hang_the_suite():
    """It hung `playground check` before: the suite read every item."""
    cls = hostile("special_sizes", lambda self: itertools.count(1))
    with pytest.raises(HookError, match="endless iterator"):
        Subject(cls)
    report = check_attention(cls, checks=[check_output_shape_and_dtype])
    assert report.results  # one per impl
    for result in report.results:
        assert result.verdict == "failed" and "special_sizes()" in result.reason


def test_good_special_sizes_are_kept_including_numpy_style_integers():
    cls = hostile("special_sizes", lambda self: [numpy.int64(5), 9])
    assert checked_special_sizes(cls(32, 4)) == (5, 9)
    assert Subject(cls).lengths == (1, 2, 5, 6, 9, 10, 16, 130)


# --- fit_options / picture_options ---------------------------------------------------------
@pytest.mark.parametrize(
    ("behaviour", "words"),
    [(lambda options, n: None, "returned None"), (_raise, "raised RuntimeError: boom")],
    ids=["none", "raises"],
)
def test_fit_options_junk_is_a_hook_error(behaviour, words):
    cls = hostile("fit_options", behaviour, static=True)
    with pytest.raises(HookError, match=r"'hostile_fit_options'.*fit_options\(\)") as raised:
        checked_options_hook(cls, "fit_options", {}, 32)
    assert words in str(raised.value)


def test_good_fit_options_pass_through():
    assert checked_options_hook(Vanilla, "fit_options", {"bias": False}, 32) == {"bias": False}


# --- share_with_first_layer --------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "words"),
    [("q_proj", "returned 'q_proj'"), ((42,), "42, which is not a one-line name")],
    ids=["string", "missing-name"],
)
def test_share_with_first_layer_junk_is_a_hook_error(value, words):
    cls = hostile("share_with_first_layer", lambda self, first: value)
    first, second = cls(32, 4), cls(32, 4)
    with pytest.raises(HookError, match=r"share_with_first_layer\(\)") as raised:
        checked_share_with_first_layer(second, first)
    assert words in str(raised.value)


def test_share_with_first_layer_names_of_attributes_pass():
    cls = hostile("share_with_first_layer", lambda self, first: ("q_proj", "q_proj.weight"))
    assert checked_share_with_first_layer(cls(32, 4), cls(32, 4)) == ("q_proj", "q_proj.weight")


# --- decoding_window ------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-5, 0, 2.5, "64", True], ids=str)
def test_decoding_window_junk_is_a_hook_error(value):
    attributes = {"name": "hostile_window", "decoding_window": lambda self: value}
    module = type("HostileWindow", (playground.SoftmaxAttention,), attributes)(32, 4)
    with pytest.raises(HookError, match=r"decoding_window\(\) hook returned"):
        module.prefill(torch.randn(1, 3, 32))


# --- logit_bias / pattern_weights ----------------------------------------------------------
def test_logit_bias_of_the_wrong_shape_is_a_hook_error():
    module = hostile("logit_bias", lambda self, n_q, n_k: torch.zeros(n_q, n_k))(32, 4)
    with pytest.raises(HookError, match=r"logit_bias\(\) hook returned \(8, 8\)"):
        checked_logit_bias(module, 8, 8)
    fine = hostile("logit_bias", lambda self, n_q, n_k: torch.zeros(1, 4, n_q, n_k))(32, 4)
    assert checked_logit_bias(fine, 8, 8).shape == (1, 4, 8, 8)


def test_pattern_weights_raising_or_junk_is_a_hook_error():
    query = torch.randn(1, 8, 32)
    module = hostile("pattern_weights", _raise)(32, 4)
    with pytest.raises(HookError, match=r"pattern_weights\(\) hook raised RuntimeError"):
        checked_pattern_weights(module, query)
    junk = hostile("pattern_weights", lambda self, q: (torch.zeros(8, 8), "slot"))(32, 4)
    with pytest.raises(HookError, match=r"weights \(8, 8\)"):
        checked_pattern_weights(junk, query)
    good = hostile("pattern_weights", lambda self, q: (torch.zeros(1, 4, 8, 3), "slot"))(32, 4)
    assert checked_pattern_weights(good, query)[1] == "slot"


# --- static hooks: refused at registration ---------------------------------------------------
PLUGIN = """
    import playground

    Vanilla = playground.get_variant("vanilla")


    class Odd(Vanilla):
        name = "{name}"
        {attribute}


    @playground.hookimpl
    def register_attention(register):
        register(Odd)
"""


@pytest.mark.parametrize(
    ("attribute", "words"),
    [
        ("colour = 7", "colour must be a matplotlib colour string"),
        ('display_name = ""', "display_name must be a non-empty single-line string"),
        ('display_name = "two\\nlines"', "display_name must be a non-empty single-line"),
        ("display_name = 3", "got 3"),
        ('display_name = "vanilla"', "would be labelled 'vanilla'"),
    ],
    ids=["colour-int", "empty-label", "multi-line-label", "int-label", "taken-label"],
)
def test_bad_display_hooks_are_refused_at_registration(write_plugin, attribute, words):
    path = write_plugin("odd.py", PLUGIN.format(name="odd", attribute=attribute))
    registry = Registry.discover([path.parent], entry_points=False, environment=False)
    assert "odd" not in registry.names() and "vanilla" in registry.names()
    messages = [str(error) for error in registry.errors]
    assert any(words in message and str(path) in message for message in messages), messages


def test_a_label_another_variant_carries_as_its_name_is_refused(write_plugin):
    """Two "vanilla" series in one figure: a display_name equal to another's name."""
    write_plugin("a.py", PLUGIN.format(name="first_odd", attribute='display_name = "Exact"'))
    path = write_plugin(
        "b.py", PLUGIN.format(name="second_odd", attribute='display_name = "Exact"')
    )
    registry = Registry.discover([path.parent], entry_points=False, environment=False)
    assert "first_odd" in registry.names() and "second_odd" not in registry.names()
    assert any("labelled 'Exact'" in str(error) for error in registry.errors)


def test_good_display_hooks_register(write_plugin):
    attribute = 'colour = "tab:blue"\n        display_name = "Odd one"'
    path = write_plugin("odd.py", PLUGIN.format(name="odd", attribute=attribute))
    registry = Registry.discover([path.parent], entry_points=False, environment=False)
    assert "odd" in registry.names(), registry.errors


def test_capabilities_assigned_on_an_instance_are_refused_naming_the_way():
    """An instance's own `capabilities` would hide from every reader of the class what it
    changed (a stale max_seq_len); `capabilities_for(config)` is the one way."""
    from playground.errors import HookError
    from tests.broken_variants import Vanilla

    class SetsItsOwn(Vanilla):
        name = "sets_its_own_capabilities_for_tests"

        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            self.capabilities = self.capabilities

    with pytest.raises(HookError, match=r"capabilities_for\(cls, config\)"):
        SetsItsOwn(16, 2)
