"""A renamed copy of each shipped variant gets exactly the treatment the original gets.

Each shipped plugin file is copied into a `--plugins-dir` with every name that is its
own renamed: its registry name, its classes, its options, methods, parameters and forward
arguments (`attention_window` becomes `attention_window_r`, `LongformerAttention` becomes
`RenamedLongformerAttention`). Nothing of the core changes. Then, with the same seeds,
the copy and the original must agree exactly in model building (sharing, positional
encoding, parameters, logits), fidelity, the figures' inputs (pattern weights, bias,
colour, name) and a run's rows and report (every field but the names and the times).

The names the core shares with a plugin (`seq_len`, `dropout`, `scale`; see
test_core_names.py) are the core's own words and keep their spelling in the copy.

`pytest tests/test_renamed_copies.py -s` prints one line per variant.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from playground.contract import AttentionVariant
from playground.model.transformer import ModelConfig, TransformerClassifier, describe
from playground.registry import Registry, bundled_dir, configure
from playground.report.pages import write_report
from playground.report.plots.figures import plot_run
from playground.report.plots.patterns import _weights
from playground.run.fidelity import measure_fidelity
from playground.run.runner import Runner
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore
from playground.softmax_attention import ExactAttention
from tests.test_core_names import core_vocabulary

PLUGINS = sorted(p for p in bundled_dir("plugins").glob("*.py") if not p.name.startswith("_"))
LIBRARIES = ("F", "torch", "nn", "functional", "math", "einops", "playground", "dataclasses")
"""`owner.name` keeps its name on these owners (`F.dropout`): what the plugin calls there
is not its own."""
TIMES = re.compile(
    r"time|wall_s|_at$|gflops|efficiency|timed_runs|label|variant|options|^cell$|gemm|flags|load_average"
)
"""Row fields that differ by name or by timing: everything else must be identical."""


def own_names(cls: type[AttentionVariant], vocabulary: set[str]) -> set[str]:
    """What the plugin names itself: options, methods and attributes, parameters and
    buffers, forward arguments, the class and config names."""
    base = set(dir(ExactAttention)) | set(AttentionVariant.__annotations__) | vocabulary
    names = {cls.__name__, cls.Config.__name__, *cls.forward_kwargs}
    names |= {f.name for f in dataclasses.fields(cls.Config)}
    names |= {a for a in vars(cls) if not a.startswith("__")}
    module = cls(16, 2)
    for parameter, _ in [*module.named_parameters(), *module.named_buffers()]:
        names.update(part for part in parameter.split(".") if not part.isdigit())
    return {name for name in names if name not in base and not hasattr(torch.nn.Linear, name)}


def renamed(name: str) -> str:
    return f"Renamed{name}" if name[0].isupper() and len(name) > 1 else f"{name}_r"


def rename(text: str, names: set[str]) -> str:
    pattern = re.compile(
        r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9_])"
    )

    def replace(match: re.Match[str]) -> str:
        start = match.start()
        if start and text[start - 1] == ".":
            owner = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\.$", text[:start])
            if owner is not None and owner.group(1) in LIBRARIES:
                return match.group(0)
        return renamed(match.group(0))

    return pattern.sub(replace, text)


@dataclasses.dataclass
class Copy:
    original: str
    copy: str
    names: set[str]

    def options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {renamed(k) if k in self.names else k: v for k, v in options.items()}


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Iterator[tuple[Registry, list[Copy]]]:
    """The renamed copies in a --plugins-dir, loaded as `playground --plugins-dir` does
    (into the default registry, which the figures read colours and names from)."""
    folder = tmp_path_factory.mktemp("renamed")
    shipped = Registry.discover(entry_points=False)
    vocabulary = core_vocabulary()
    made = []
    for path in PLUGINS:
        names = {
            name for name in shipped.names() if Path(inspect.getfile(shipped.get(name))) == path
        }
        own = set().union(*(own_names(shipped.get(name), vocabulary) for name in names)) | names
        (folder / f"renamed_{path.stem}.py").write_text(rename(path.read_text(), own))
        made.extend(Copy(name, renamed(name), own) for name in sorted(names))
    registry = configure([folder])
    assert not registry.errors, registry.errors
    yield registry, made
    configure()


def test_every_shipped_variant_has_a_renamed_copy(copies):
    registry, made = copies
    assert {copy.original for copy in made} == set(Registry.discover(entry_points=False).names())
    for copy in made:
        assert copy.copy in registry.names()
        assert registry.get(copy.copy).__name__ != registry.get(copy.original).__name__


def build_pair(registry: Registry, copy: Copy, options: dict[str, Any], d_model=16, heads=2):
    torch.manual_seed(0)
    original = registry.build(copy.original, d_model, heads, **options)
    torch.manual_seed(0)
    renamed_copy = registry.build(copy.copy, d_model, heads, **copy.options(options))
    return original, renamed_copy


def model_config(variant: str, options: dict[str, Any], causal: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=12,
        num_classes=5,
        max_seq_len=16,
        variant=variant,
        variant_options=options,
        d_model=16,
        num_heads=2,
        num_layers=3,
        causal=causal,
        pooling="first",
    )


def same_model(registry: Registry, copy: Copy) -> None:
    cls = registry.get(copy.original)
    options = dict(cls.suite_options)
    tokens = torch.randint(1, 12, (2, 16), generator=torch.Generator().manual_seed(0))
    for causal in (False, True) if cls.capabilities.causal else (False,):
        models = []
        for variant, chosen in ((copy.original, options), (copy.copy, copy.options(options))):
            torch.manual_seed(0)
            models.append(TransformerClassifier(model_config(variant, chosen, causal), registry))
        first, second = (describe(model) for model in models)
        for key in ("parameters", "shared_across_layers", "positional_encoding_used"):
            assert first[key] == second[key], (copy.original, key, first[key], second[key])
        torch.testing.assert_close(models[0](tokens), models[1](tokens), rtol=0, atol=0)


def same_fidelity(registry: Registry, copy: Copy) -> None:
    original, renamed_copy = build_pair(registry, copy, registry.get(copy.original).suite_options)
    assert measure_fidelity(original, 64, 2, 0) == measure_fidelity(renamed_copy, 64, 2, 0)


def same_figures(registry: Registry, copy: Copy) -> None:
    a, b = registry.get(copy.original), registry.get(copy.copy)
    assert (a.colour, a.display_name) == (b.colour, b.display_name)
    options = a.suite_options
    assert copy.options(a.picture_options(options, 64)) == b.picture_options(
        copy.options(options), 64
    )
    first, second = build_pair(registry, copy, a.picture_options(options, 64))
    tokens = torch.randn(1, 64, 16, generator=torch.Generator().manual_seed(0))
    (weights_a, columns_a), (weights_b, columns_b) = (
        _weights(first, tokens),
        _weights(second, tokens),
    )
    assert rename(columns_a, copy.names) == columns_b  # its own words for the columns
    if weights_a is None:
        assert weights_b is None
    else:
        torch.testing.assert_close(weights_a, weights_b, rtol=0, atol=0)
    bias_a, bias_b = first.logit_bias(64, 64), second.logit_bias(64, 64)
    assert (bias_a is None) == (bias_b is None)
    if bias_a is not None:
        torch.testing.assert_close(bias_a, bias_b, rtol=0, atol=0)


@pytest.mark.slow
def test_renamed_copies_get_the_same_treatment(copies, tmp_path, capsys):
    registry, made = copies
    lines = []
    for copy in made:
        same_model(registry, copy)
        same_fidelity(registry, copy)
        same_figures(registry, copy)
        lines.append(f"{copy.original:>15} -> {copy.copy:<17} model, fidelity, figures: identical")
    same_run_and_report(registry, made, tmp_path)
    lines.append(
        f"{'(all)':>15}    one run of all {2 * len(made)}: rows identical but for names and times; report lists both"
    )
    with capsys.disabled():
        print("\nrenamed copies:\n" + "\n".join(lines))


def same_run_and_report(registry: Registry, made: list[Copy], tmp_path: Path) -> None:
    entries = []
    for copy in made:
        cls = registry.get(copy.original)
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in cls.suite_options.items()}
        for name, chosen in ((copy.original, options), (copy.copy, copy.options(options))):
            table = "".join(f"{k} = {toml_value(v)}\n" for k, v in chosen.items())
            entries.append(f'[[variants]]\nname = "{name}"\n{table}')
    spec_path = tmp_path / "renamed.toml"
    spec_path.write_text(
        'name = "renamed"\nseq_lens = [16]\nd_model = 16\nnum_heads = 2\n'
        'measures = ["speed", "memory", "fidelity"]\n[timing]\nmin_run_time = 0.01\n\n'
        + "\n".join(entries)
    )
    spec = load_spec(spec_path, registry)
    store = RunStore.create(tmp_path / "out", spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    runner.measure_pending()
    rows = store.rows()
    by_label = {}
    for row in rows:
        by_label.setdefault(row["variant"], []).append(row)
    for copy in made:
        first, second = by_label[copy.original], by_label[copy.copy]
        assert len(first) == len(second) > 0
        for a, b in zip(first, second, strict=True):
            kept = {k: v for k, v in a.items() if not TIMES.search(k)}
            other = {k: v for k, v in b.items() if not TIMES.search(k)}
            assert kept == other, (
                copy.original,
                set(kept.items()) ^ set(map(tuple, other.items())),
            )
    html_path, _ = write_report(store.directory, plot_run(store.directory, registry=registry))
    html = html_path.read_text()
    for copy in made:
        assert copy.original in html and copy.copy in html


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def test_the_comparison_fails_when_the_core_special_cases_a_name(copies, monkeypatch):
    """The coupling fidelity.py had: parameters copied by a rename of Longformer's own
    parameter names. The original then gets its global projections from exact attention
    and the renamed copy does not, and the fidelity comparison says so."""
    registry, made = copies
    [longformer] = [copy for copy in made if copy.original == "longformer"]

    def copy_by_name(reference: AttentionVariant, variant: AttentionVariant) -> None:
        source = reference.state_dict()
        update = {
            key: source[key.replace("_global_proj.", "_proj.")]
            for key in variant.state_dict()
            if key.replace("_global_proj.", "_proj.") in source
        }
        variant.load_state_dict(update, strict=False)

    monkeypatch.setattr("playground.run.fidelity.copy_reference_weights", copy_by_name)
    with pytest.raises(AssertionError):
        same_fidelity(registry, longformer)
