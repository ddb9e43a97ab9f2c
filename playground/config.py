"""Typed variant options: the base config, validation of user options, and their docs.

A variant's options are a dataclass deriving from `VariantConfig`; each field has a type,
a default and a docstring (a string literal on the line after the field, as Sphinx reads
them). Options come from Python calls, TOML specs and the CLI, so they are checked here
against the field types before any module is built.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from playground.errors import ConfigError


@dataclass(frozen=True)
class VariantConfig:
    """Options every variant has."""

    impl: Literal["fast", "reference"] = "fast"
    """`reference`: the paper's math, dense and obvious (the oracle in tests);
    `fast`: the optimised path, gated against the reference by the contract suite."""


def require_positive(config: Any, *names: str) -> None:
    """In a config's `__post_init__`: each named option is an integer >= 1 (ValueError
    naming it otherwise; the builder turns that into a ConfigError naming the variant)."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value}")


def require_range(
    config: Any, name: str, low: float, high: float, *, high_inclusive: bool = False
) -> None:
    """In a config's `__post_init__`: low <= option < high (or <= high)."""
    value = getattr(config, name)
    inside = low <= value <= high if high_inclusive else low <= value < high
    if not inside:
        closing = "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be in [{low}, {high}{closing}; got {value}")


def picture_width(value: int, seq_len: int) -> int:
    """A width (a window, a number of slots) fitted to a picture of `seq_len` tokens, for
    `AttentionVariant.picture_options`: at most a quarter of the picture, so that what is
    outside it shows, and at least 2."""
    return max(2, min(value, seq_len // 4))


@dataclass(frozen=True)
class OptionInfo:
    """One option of a variant, as `playground info` shows it."""

    name: str
    type: str
    default: Any
    doc: str


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _coerce(value: Any, annotation: Any) -> Any:
    """Return `value` converted to `annotation`, or raise TypeError.

    Conversions are the lossless ones a TOML file or a command line needs: int → float,
    list → tuple. bool is never taken for int (True is not a window size).
    """
    if annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        raise TypeError(f"must be one of {', '.join(repr(a) for a in args)}")
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _coerce(value, option)
            except TypeError:
                continue
        raise TypeError(f"must be {_type_name(annotation)}")
    if annotation is type(None):
        if value is None:
            return None
        raise TypeError("must be None")
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"must be a tuple or list, like {_type_name(annotation)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(item, args[0]) for item in value)
        if len(args) != len(value):
            raise TypeError(f"must have {len(args)} items")
        return tuple(_coerce(item, arg) for item, arg in zip(args, value, strict=False))
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError("must be a number")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -(2**63) <= value < 2**63:
                raise TypeError("must fit in a 64-bit integer (torch cannot index with it)")
            return value
        raise TypeError("must be an integer")
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise TypeError(f"must be {annotation.__name__}")
    raise TypeError(f"has an annotation the playground cannot check: {annotation!r}")


def field_types(config_cls: type[Any]) -> dict[str, Any]:
    """The resolved type of every field of a config dataclass."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)}


def build_config(
    config_cls: type[Any], options: dict[str, Any], name: str, kind: str = "variant"
) -> Any:
    """Validate `options` against the dataclass `config_cls` and return the instance.

    Raises ConfigError naming the variant (or task: `kind`) and option for an unknown
    option (listing the valid ones), a value of the wrong type, or a value the dataclass's
    own checks reject.
    """
    types_by_name = field_types(config_cls)
    owner = f"{kind} {name!r}"
    unknown = sorted(set(options) - set(types_by_name))
    if unknown:
        hint = f" (see `playground info {name}`)" if kind == "variant" else ""
        nearest = {u: difflib.get_close_matches(u, list(types_by_name), n=1) for u in unknown}
        named = ", ".join(
            repr(u) + (f" (did you mean {nearest[u][0]!r}?)" if nearest[u] else "") for u in unknown
        )
        raise ConfigError(
            f"{owner} has no option {named}; "
            f"valid options: {', '.join(types_by_name) or '(none)'}{hint}"
        )
    values = {}
    for option, value in options.items():
        try:
            values[option] = _coerce(value, types_by_name[option])
        except TypeError as error:
            raise ConfigError(
                f"option {option!r} of {owner} {error}; got {value!r} ({type(value).__name__})"
            ) from None
    try:
        return config_cls(**values)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{owner}: {error}") from None


@functools.cache
def _field_docstrings(config_cls: type) -> dict[str, str]:
    """Attribute docstrings (the string after each field) of a class and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        for statement, following in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def describe_options(config_cls: type[VariantConfig]) -> list[OptionInfo]:
    """Name, type, default and docstring of every option, in declaration order."""
    # Passed as a plain `type`: mypy checks a class object against the cache's Hashable
    # through its instances' __hash__, which a frozen dataclass defines, and rejects it.
    source: type = config_cls
    docs = _field_docstrings(source)
    types_by_name = field_types(config_cls)
    return [
        OptionInfo(
            name=f.name,
            type=_type_name(types_by_name[f.name]),
            default=f.default,
            doc=" ".join(docs.get(f.name, f.metadata.get("doc", "")).split()),  # one paragraph
        )
        for f in dataclasses.fields(config_cls)
    ]
