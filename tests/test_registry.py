"""Plugin discovery: bundled files, directories, the environment variable, entry points;
load errors reported with their source while everything else still loads."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
import torch

import playground
from playground import DuplicateVariant, UnknownVariant
from playground.registry import Registry, configure, default_registry

GOOD_PLUGIN = """
    import playground

    Vanilla = playground.get_variant("vanilla")

    class {cls}(Vanilla):
        name = "{name}"
        summary = "vanilla under another name"

    @playground.hookimpl
    def register_attention(register):
        register({cls})
"""


def good_plugin(name: str) -> str:
    return GOOD_PLUGIN.format(name=name, cls=name.title().replace("_", ""))


def test_bundled_plugins_are_discovered(bundled_registry):
    assert "vanilla" in bundled_registry.names()
    assert bundled_registry.source_of("vanilla").endswith("plugins/vanilla.py")
    assert not bundled_registry.errors


def test_plugins_dir_adds_variants(write_plugin):
    path = write_plugin("mine.py", good_plugin("mine"))
    registry = Registry.discover([path.parent], entry_points=False)
    assert {"vanilla", "mine"} <= set(registry.names())
    assert registry.source_of("mine") == str(path.resolve())
    module = registry.build("mine", d_model=16, num_heads=2)
    assert module(torch.randn(1, 5, 16)).output.shape == (1, 5, 16)


def test_environment_variable_adds_directories(write_plugin, monkeypatch):
    path = write_plugin("from_env.py", good_plugin("from_env"))
    monkeypatch.setenv("PLAYGROUND_PLUGINS_PATH", str(path.parent))
    registry = Registry.discover(entry_points=False)
    assert "from_env" in registry.names()
    assert [p.kind for p in registry.plugins if p.variants == ["from_env"]] == [
        "PLAYGROUND_PLUGINS_PATH"
    ]


def test_missing_plugins_dir_is_reported(tmp_path):
    registry = Registry.discover([tmp_path / "nope"], entry_points=False)
    assert "does not exist" in str(registry.errors[0])
    assert "vanilla" in registry.names()


def test_entry_point_of_an_installed_distribution_is_loaded(tmp_path, monkeypatch):
    # A real (if minimal) installed distribution: a module plus a .dist-info folder whose
    # entry_points.txt names it in group "playground", found on sys.path by
    # importlib.metadata exactly as a pip-installed package would be.
    (tmp_path / "third_party_attention.py").write_text(textwrap.dedent(good_plugin("third_party")))
    info = tmp_path / "third_party_attention-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: third-party-attention\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[playground]\nthird_party = third_party_attention\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "third_party_attention", raising=False)
    registry = Registry.discover()
    assert "third_party" in registry.names()
    assert registry.source_of("third_party") == "entry point third_party = third_party_attention"


def test_plugin_that_raises_on_import_is_reported_and_others_load(write_plugin):
    bad = write_plugin("explodes.py", "raise RuntimeError('no GPU here')\n")
    write_plugin("fine.py", good_plugin("fine"))
    registry = Registry.discover([bad.parent], entry_points=False)
    assert {"vanilla", "fine"} <= set(registry.names())
    (error,) = registry.errors
    assert error.source == str(bad.resolve())
    assert "RuntimeError: no GPU here" in error.message and "line 1" in error.message


def test_plugin_with_syntax_error_is_reported_with_its_line(write_plugin):
    bad = write_plugin("typo.py", "x = 1\ndef broken(:\n")
    registry = Registry.discover([bad.parent], entry_points=False)
    (error,) = registry.errors
    assert "SyntaxError" in error.message and "line 2" in error.message
    assert "vanilla" in registry.names()


def test_registering_something_that_is_not_a_variant_is_an_error(write_plugin):
    bad = write_plugin(
        "wrong.py",
        """
        import playground

        @playground.hookimpl
        def register_attention(register):
            register(lambda q: q)
        """,
    )
    registry = Registry.discover([bad.parent], entry_points=False)
    (error,) = registry.errors
    assert "not an attention variant" in error.message and "AttentionVariant" in error.message


def test_variant_without_reference_path_is_refused(write_plugin):
    bad = write_plugin(
        "incomplete.py",
        """
        import playground

        class Half(playground.AttentionVariant):
            name = "half"
            summary = "no math"
            paper = "none"

        @playground.hookimpl
        def register_attention(register):
            register(Half)
        """,
    )
    registry = Registry.discover([bad.parent], entry_points=False)
    assert "forward_reference" in registry.errors[0].message
    assert "half" not in registry.names()


def test_misspelled_hook_is_reported(write_plugin):
    bad = write_plugin(
        "misspelled.py",
        """
        import playground

        @playground.hookimpl
        def register_attentions(register):
            pass
        """,
    )
    registry = Registry.discover([bad.parent], entry_points=False)
    assert "register_attentions" in registry.errors[0].message


def test_duplicate_names_name_both_sources(write_plugin):
    first = write_plugin("a.py", good_plugin("twin"))
    second = write_plugin("b.py", good_plugin("twin"))
    registry = Registry.discover([first.parent], entry_points=False)
    with pytest.raises(DuplicateVariant) as raised:
        registry.get("twin")
    assert str(first.resolve()) in str(raised.value) and str(second.resolve()) in str(raised.value)
    assert registry.errors == [raised.value]


def test_duplicate_of_a_bundled_variant_is_an_error(write_plugin):
    shadow = write_plugin("shadow.py", good_plugin("vanilla"))
    registry = Registry.discover([shadow.parent], entry_points=False)
    with pytest.raises(DuplicateVariant, match=r"plugins/vanilla\.py"):
        registry.build("vanilla")


def test_unknown_variant_suggests_close_names(bundled_registry):
    with pytest.raises(UnknownVariant, match=r"did you mean 'vanilla'\?"):
        bundled_registry.get("vanila")
    with pytest.raises(LookupError):  # the built-in family still catches it
        bundled_registry.get("nothing_like_it")


def test_public_api_uses_the_default_registry(write_plugin):
    path = write_plugin("public.py", good_plugin("public"))
    try:
        configure([path.parent])
        assert "public" in playground.list_variants()
        assert playground.get_variant("public").name == "public"
        assert isinstance(
            playground.build("public", d_model=8, num_heads=2), playground.AttentionVariant
        )
    finally:
        configure([])
    assert "public" not in default_registry().names()


BROKEN_CLASS_PLUGIN = """
    import playground

    Vanilla = playground.get_variant("vanilla")

    class Broken(Vanilla):
        name = "broken_class"
        {body}

    @playground.hookimpl
    def register_attention(register):
        register(Broken)
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("capabilities = {'causal': True}", "capabilities must be a playground.Capabilities"),
        (
            "flops = staticmethod(lambda n_q, n_k, d_model, num_heads, **o: 1 / 0)",
            r"flops\(16, 16, 64, 4, \*\*default options\) raised ZeroDivisionError",
        ),
        (
            "flops = staticmethod(lambda n_q, n_k, d_model, num_heads, **o: 'many')",
            "must return a number of FLOPs; got 'many'",
        ),
        (
            "flops = staticmethod(lambda n_q, n_k, d_model, num_heads, **o: float('nan'))",
            "must return a finite number >= 0",
        ),
        ("summary = ''", "must set the class attribute 'summary'"),
    ],
    ids=["capabilities", "flops-raises", "flops-not-a-number", "flops-nan", "no-summary"],
)
def test_a_broken_class_is_refused_at_registration_naming_its_file(write_plugin, body, message):
    path = write_plugin("broken_class.py", textwrap.dedent(BROKEN_CLASS_PLUGIN).format(body=body))
    registry = Registry.discover([path.parent], entry_points=False)
    assert "broken_class" not in registry.names()
    assert "vanilla" in registry.names()  # everything else still loads and lists
    (error,) = registry.errors
    assert error.source == str(path.resolve())
    assert re.search(message, error.message), error.message
    for name in registry.names():  # what `playground list` reads for every variant
        cls = registry.get(name)
        assert cls.capabilities.features() and cls.flops(8, 8, 16, 2) > 0


@pytest.mark.parametrize("name", [None, 3, ["vanilla"]])
def test_a_name_that_is_not_a_string_is_a_clear_error(name):
    with pytest.raises(playground.ConfigError, match=r"named by its registered name, a string"):
        playground.build(name)
