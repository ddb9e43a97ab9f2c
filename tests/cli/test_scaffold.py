"""`playground new`: the scaffolded file loads, registers its name, passes the contract
suite and the project's lint as written; bad names and existing files are refused."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from playground.cli import main, scaffold
from playground.cli.scaffold import create_variant
from playground.errors import PlaygroundError
from playground.registry import Registry, configure
from playground.testing import check_attention
from playground.testing.checks import check_fast_matches_reference

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def _registry_with(directory: Path) -> Registry:
    registry = Registry.discover([directory], entry_points=False, environment=False)
    assert not registry.errors, registry.errors
    return registry


def test_template_variant_passes_the_contract_suite(bundled_registry, tmp_path):
    created = create_variant("myattn", bundled_registry, tmp_path)
    assert created.path == tmp_path / "myattn.py"
    assert created.class_name == "MyattnAttention"
    assert not created.in_bundled_plugins
    registry = _registry_with(tmp_path)
    report = check_attention("myattn", registry=registry)
    assert report.ok, report.failures
    assert report.verdict_of("check_causality") == "passed"  # declared, so really checked
    assert registry.get("myattn").forward_fast is None  # reference only: the readable math


def test_mod_template_is_short_and_passes_the_contract_suite(bundled_registry, tmp_path):
    created = create_variant("mymod", bundled_registry, tmp_path, kind="mod")
    text = created.path.read_text()
    # Docstring and the commented example of an option of one's own included.
    assert len(text.splitlines()) <= 36, len(text.splitlines())
    assert "def score_mod(self, score, b, h, q_idx, kv_idx)" in text
    assert "def mask_mod(self, b, h, q_idx, kv_idx)" in text
    registry = _registry_with(tmp_path)
    report = check_attention("mymod", registry=registry)
    assert report.ok, report.failures
    assert report.verdict_of("check_fast_matches_reference") == "passed"  # blocked == dense


def test_mod_template_declares_nothing_so_an_edited_mod_stays_right(bundled_registry, tmp_path):
    """Issue 42: the template declared `additive_score_mod = True`; a user who kept the line
    and wrote a tanh soft-cap got a fast path that adds instead (5 checks failed). The
    template declares nothing; the structure is proven by trace."""
    created = create_variant("softcapped", bundled_registry, tmp_path, kind="mod")
    text = created.path.read_text()
    assert "additive_score_mod" not in text and "relative_score_mod" not in text
    registry = _registry_with(tmp_path)
    assert registry.build("softcapped", 32, 4).score_mod_structure().reason == ("proven by trace")
    edited = text.replace(
        "return score - 0.1 * (q_idx - kv_idx).abs()", "return 5.0 * torch.tanh(score / 5.0)"
    ).replace("import playground\n", "import torch\n\nimport playground\n")
    assert edited != text
    created.path.write_text(edited)
    registry = _registry_with(tmp_path)
    assert registry.build("softcapped", 32, 4).score_mod_structure().kind == "general"
    report = check_attention("softcapped", checks=[check_fast_matches_reference], registry=registry)
    assert report.verdict_of("check_fast_matches_reference") == "passed", report.failures


def test_from_and_kind_do_not_combine(tmp_path, capsys):
    assert main(["new", "mine", "--from", "vanilla", "--kind", "mod", "--dir", str(tmp_path)]) == 2
    assert "does not combine with --kind" in capsys.readouterr().err
    assert not (tmp_path / "mine.py").exists()


def test_template_has_the_classic_math_and_says_what_to_edit(bundled_registry, tmp_path):
    text = create_variant("my_attn", bundled_registry, tmp_path).path.read_text()
    for expected in (
        "class MyAttnConfig(VariantConfig)",
        "class MyAttnAttention(AttentionVariant)",
        'name = "my_attn"',
        "q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)",
        "masked_softmax(scores, allowed)",
        "weights @ v",
        '"b h n d -> b n (h d)"',
        "self.out_proj(",
        "What to edit",
        "@playground.hookimpl",
        "playground --plugins-dir DIR check my_attn",
    ):
        assert expected in text, expected


@pytest.mark.parametrize("kind", ["reference", "mod"])
def test_docstring_next_steps_fit_where_the_file_lies(kind):
    """A --dir plugin has no nox session (the `variant` session only knows plugins/): its
    docstring must not recommend one, and must say how to load it."""
    outside, _ = scaffold.render_template("my_attn", kind, in_bundled_plugins=False)
    docstring = outside.split('"""')[1]
    assert "nox" not in docstring
    assert "playground --plugins-dir DIR check my_attn" in docstring
    inside, _ = scaffold.render_template("my_attn", kind, in_bundled_plugins=True)
    assert "nox -s \"variant(name='my_attn')\"" in inside.split('"""')[1]


def test_cli_next_steps_never_run_into_their_purpose(capsys, tmp_path):
    """ "... check softcap run the contract suite on it": a long --dir path ate the gap."""
    deep = tmp_path / "a-rather-long-directory-name" / "and-another-one"
    assert main(["new", "softcap", "--dir", str(deep)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "--plugins-dir" in line]
    assert len(lines) == 2
    for line in lines:
        command, purpose = line.split("  # ")
        assert command.split()[-1] in ("softcap", "compare") and purpose.strip()


def test_mod_template_shows_how_to_add_an_option(bundled_registry, tmp_path):
    """Uncommenting the template's config example gives a variant with that option."""
    created = create_variant("penalised", bundled_registry, tmp_path, kind="mod")
    text = created.path.read_text()
    assert "(playground.SoftmaxAttention.Config)" in text
    lines = text.splitlines()
    start = lines.index("# import dataclasses")
    end = lines.index("", start)  # the example ends at the first blank line
    lines[start:end] = [re.sub(r"^# ?", "", line) for line in lines[start:end]]
    uncommented = "\n".join(lines).replace("    # Config = ", "    Config = ")
    created.path.write_text(uncommented)
    registry = _registry_with(tmp_path)
    assert registry.build("penalised", 32, 4, penalty=0.5).config.penalty == 0.5


def test_copy_from_vanilla_is_renamed_and_passes_the_suite(bundled_registry, tmp_path):
    created = create_variant("fastcopy", bundled_registry, tmp_path, copy_from="vanilla")
    text = created.path.read_text()
    assert "VanillaAttention" not in text and "VanillaConfig" not in text
    assert 'name = "fastcopy"' in text and "class FastcopyAttention" in text
    registry = _registry_with(tmp_path)
    assert registry.get("fastcopy").forward_fast is not None  # the fused path came along
    report = check_attention("fastcopy", registry=registry)
    assert report.ok, report.failures
    assert report.verdict_of("check_fast_matches_reference") == "passed"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("MyAttn", "for example 'myattn'"),
        ("my-attn", "for example 'my_attn'"),
        ("_hidden", "files starting with _ are not loaded"),
        ("2fast", "lower-case Python identifier"),
        ("", "lower-case Python identifier"),
        ("class", "is a Python keyword"),
        ("vanilla", "already registered (from"),
    ],
)
def test_bad_names_are_refused_before_writing(bundled_registry, tmp_path, name, message):
    with pytest.raises(PlaygroundError, match=re.escape(message)):
        create_variant(name, bundled_registry, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_never_overwritten(bundled_registry, tmp_path):
    existing = tmp_path / "mine.py"
    existing.write_text("# my work in progress\n")
    with pytest.raises(PlaygroundError, match="already exists; not overwriting"):
        create_variant("mine", bundled_registry, tmp_path)
    assert existing.read_text() == "# my work in progress\n"


def test_copy_that_cannot_be_renamed_is_refused(write_plugin, tmp_path):
    plugin = write_plugin(
        "tupled.py",
        """
        import playground
        from tests.broken_variants import Vanilla

        class Tupled(Vanilla):
            name, summary = "tupled", "its name is set in a tuple assignment"

        @playground.hookimpl
        def register_attention(register):
            register(Tupled)
        """,
    )
    registry = Registry.discover([plugin.parent], bundled=False, entry_points=False)
    assert registry.names() == ["tupled"]
    out = tmp_path / "out"
    with pytest.raises(PlaygroundError, match="copy it by hand"):
        create_variant("renamed", registry, out, copy_from="tupled")
    assert not (out / "renamed.py").exists()


def test_a_written_file_that_does_not_register_its_name_is_removed(
    bundled_registry, tmp_path, monkeypatch
):
    broken = tmp_path / "broken.tmpl"
    broken.write_text("import playground\n# ${name} ${class_name} ${config_name}\n")
    monkeypatch.setitem(scaffold.TEMPLATES, "reference", broken)
    with pytest.raises(PlaygroundError, match=r"did not load cleanly, so it was removed.*no hook"):
        create_variant("ghost", bundled_registry, tmp_path / "out")
    assert not (tmp_path / "out" / "ghost.py").exists()


def test_installed_wheel_needs_an_explicit_directory(bundled_registry, tmp_path, monkeypatch):
    wheel_plugins = tmp_path / "site" / "playground" / "_bundled" / "plugins"
    monkeypatch.setattr(scaffold, "bundled_dir", lambda kind: wheel_plugins)
    with pytest.raises(PlaygroundError, match="pass --dir DIR"):
        create_variant("myattn", bundled_registry)


def test_cli_new_prints_the_next_steps(capsys, tmp_path):
    code = main(["new", "myattn", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "myattn.py").is_file()
    assert f"playground --plugins-dir {tmp_path} check myattn" in out
    assert f"playground --plugins-dir {tmp_path} compare" in out
    code = main(["new", "myattn", "--dir", str(tmp_path)])
    assert code == 2 and "already exists" in capsys.readouterr().err


def test_next_steps_in_the_checkout_include_the_nox_session(tmp_path):
    steps = scaffold.Scaffold("myattn", tmp_path / "myattn.py", "MyattnAttention", True)
    assert [command for command, _ in steps.next_steps()] == [
        "playground check myattn",
        "nox -s \"variant(name='myattn')\"",
        "playground compare",
    ]


def _ruff() -> str | None:
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.is_file() else shutil.which("ruff")


@pytest.mark.skipif(_ruff() is None, reason="ruff is not installed (pip install -e '.[dev]')")
@pytest.mark.parametrize(
    ("copy_from", "kind"), [(None, "reference"), ("vanilla", "reference"), (None, "mod")]
)
def test_scaffolded_file_passes_the_projects_lint(bundled_registry, tmp_path, copy_from, kind):
    """`nox -s lint` covers plugins/, so a new file must be clean as written."""
    text = create_variant("myattn", bundled_registry, tmp_path, copy_from=copy_from, kind=kind)
    source = text.path.read_text()
    for command in (["check"], ["format", "--check"]):
        completed = subprocess.run(
            [_ruff(), *command, "--stdin-filename", "plugins/myattn.py", "-"],
            input=source,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
