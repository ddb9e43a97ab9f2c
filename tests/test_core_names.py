"""The core never names a shipped variant, nor one of its options, methods or parameters:
what a shipped plugin gets from the core, a researcher's plugin gets by the same hooks.

The scan reads every module of `playground/` as code: docstrings and comments are left
out (they may cite a variant as an example), and what remains (string constants,
attribute names, keyword names) must not contain a name that only a shipped plugin
defines. A name the core defines itself (a field of one of its dataclasses, such as
`seq_len` of a results line, or an attribute of its base classes) is the core's own word
and is not flagged; the test lists those overlaps so that they stay few and visible.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import torch

import playground
from playground.contract import AttentionVariant
from playground.registry import Registry, bundled_dir
from playground.softmax_attention import ExactAttention, SoftmaxAttention

CORE = Path(playground.__file__).parent
SHORT = 3
"""Names shorter than this (Linformer's `k`, `E`) are flagged only as a whole string."""


def shipped_names() -> dict[str, str]:
    """Every name a shipped plugin defines -> where it comes from."""
    registry = Registry()
    registry.load_directory(bundled_dir("plugins"), kind="plugins/")
    base = set(dir(SoftmaxAttention)) | set(AttentionVariant.__annotations__)
    base_options = {f.name for f in dataclasses.fields(playground.SoftmaxConfig)}
    names: dict[str, str] = {}
    for name in registry.names():
        cls = registry.get(name)
        names[name] = f"variant {name}"
        names[cls.__name__] = f"class of {name}"
        names[cls.Config.__name__] = f"config of {name}"
        for field in dataclasses.fields(cls.Config):
            if field.name not in base_options:
                names.setdefault(field.name, f"option of {name}")
        for attribute in vars(cls):
            if not attribute.startswith("__") and attribute not in base:
                names.setdefault(attribute.lstrip("_"), f"method or attribute of {name}")
        module = registry.build(name, 16, 2)
        for parameter, _ in [*module.named_parameters(), *module.named_buffers()]:
            for part in parameter.split("."):
                if not part.isdigit() and part not in base and not hasattr(torch.nn.Linear, part):
                    names.setdefault(part, f"parameter of {name}")
                    head, _, rest = part.partition("_")
                    if len(head) == 1 and rest:  # q_global_proj: also "global_proj"
                        names.setdefault(rest, f"parameter of {name}")
    return names


def torch_words() -> set[str]:
    """The public functions of torch.nn.functional: torch's words (`F.linear`), which the
    core may use for themselves even where a shipped variant has the same name."""
    return {name for name in dir(torch.nn.functional) if not name.startswith("_")}


def core_vocabulary() -> set[str]:
    """Names the core defines itself: fields of its dataclasses, attributes and
    parameters of its base classes (the contract's `q_proj`), and torch's words."""
    words = set(dir(SoftmaxAttention)) | set(dir(torch.nn.Linear)) | torch_words()
    for parameter, _ in ExactAttention(16, 2).named_parameters():
        for part in parameter.split("."):
            words.update((part, part.partition("_")[2]))
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, ast.AnnAssign) and isinstance(
                        statement.target, ast.Name
                    ):
                        words.add(statement.target.id)
    return words


def code_words(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings left out), attribute name and
    keyword name in a module."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
        if isinstance(node, (ast.Module, ast.ClassDef)):  # attribute docstrings
            for before, after in zip(node.body, node.body[1:], strict=False):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                    docstrings.add(id(after.value))
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words.append((node.lineno, node.value))
        elif isinstance(node, ast.Attribute):
            words.append((node.lineno, node.attr))
        elif isinstance(node, ast.keyword) and node.arg:
            words.append((node.lineno, node.arg))
    return words


def found_in(text: str, name: str) -> bool:
    if len(name) < SHORT:
        return text == name
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text) is not None


def scan(names: dict[str, str], root: Path = CORE) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        for line, text in code_words(path):
            for name, origin in names.items():
                if found_in(text, name):
                    hits.append(f"{path.relative_to(root.parent)}:{line}: {name!r} ({origin})")
    return hits


def protected_names() -> dict[str, str]:
    vocabulary = core_vocabulary()
    return {name: origin for name, origin in shipped_names().items() if name not in vocabulary}


THIRD_PARTY_WORDS = {
    ("playground/hf/swap.py", "sliding_window"): (
        "transformers' config attribute (MistralConfig, Qwen2Config): the bridge reads it to "
        "refuse swapping into a windowed model, whose mask a swapped module cannot follow"
    ),
}
"""Another library's word that is also a shipped variant's name, where the core must use
it: (module, word) -> why. Kept to this list."""


def test_the_core_names_no_shipped_variant_option_method_or_parameter():
    hits = [
        hit
        for hit in scan(protected_names())
        if not any(
            hit.startswith(f"{module}:") and f": {word!r} " in hit
            for module, word in THIRD_PARTY_WORDS
        )
    ]
    assert not hits, "the core names what only a shipped plugin defines:\n" + "\n".join(hits)


def test_the_overlap_with_the_core_vocabulary_is_known():
    """Shipped options that are also the core's own words, so the scan cannot tell them
    apart: kept to this list, each a word the core needs for itself (a results line's
    `seq_len`, a model's `dropout`, a plotted metric's `scale`, a rolling decoding cache's
    `window`)."""
    options = {name for name, origin in shipped_names().items() if origin.startswith("option")}
    overlap = sorted(options & core_vocabulary())
    assert overlap == ["dropout", "scale", "seq_len", "window"], overlap


def test_the_variants_named_like_torch_functions_are_known():
    """Shipped variants whose name is also a torch function (`linear` and F.linear,
    `sigmoid` and torch.sigmoid): the scan cannot tell the core's use of torch's word from
    naming the variant, so it skips them; kept to this list. What guards those two is
    behaviour, not names: tests/test_renamed_copies.py runs renamed copies of every
    shipped plugin and expects the same results."""
    variants = {name for name, origin in shipped_names().items() if origin.startswith("variant")}
    assert sorted(variants & torch_words()) == ["linear", "sigmoid"]


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ('def f(options):\n    return options.get("attention_window")\n', "attention_window"),
        ("def f(module):\n    return module.slot_weights\n", "slot_weights"),
        ('def f(key):\n    return key.replace("_global_proj.", "_proj.")\n', "global_proj"),
        ('BASELINE = "vanilla"\n', "vanilla"),
        ('def f(options):\n    return options["k"]\n', "k"),
    ],
    ids=["option", "method", "parameter", "variant", "short-option"],
)
def test_the_scan_catches_each_kind_of_coupling(tmp_path, code, name):
    package = tmp_path / "playground"
    package.mkdir()
    (package / "coupled.py").write_text('"""A docstring may say vanilla."""\n' + code)
    hits = scan(protected_names(), package)
    assert any(f"{name!r}" in hit for hit in hits), hits
    (package / "coupled.py").write_text('"""It may say vanilla and slot_weights."""\n# k\n')
    assert scan(protected_names(), package) == []
