"""Nothing fails silently (issue 30, §3 and §4): a plugin that fails to load is named by
every command that resolves variants, a request for one of its variants names the file and
its error, a `--kind mod` class with a config that drops SoftmaxAttention's options is
refused, and the contract suite's messages name the likely cause instead of crashing or
guessing."""

from __future__ import annotations

import pytest
import torch

import playground
from playground.cli import main
from playground.errors import UnknownVariant, VariantFailedToLoad
from playground.registry import Registry, configure
from playground.testing import check_attention
from playground.testing.checks import check_fast_matches_reference, check_output_shape_and_dtype


@pytest.fixture(autouse=True)
def _reset_default_registry(monkeypatch):
    monkeypatch.delenv("PLAYGROUND_PLUGINS_PATH", raising=False)
    yield
    configure([])


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


SYNTAX_ERROR = """
    import playground


    class Softcap(playground.SoftmaxAttention):
        name, summary, paper = "softcap", "s", "-"

        def score_mod(self, score, b, h, q_idx, kv_idx)
            return score
"""

GOOD = """
    import playground


    class Fine(playground.SoftmaxAttention):
        name, summary, paper = "fine_mod", "s", "-"


    @playground.hookimpl
    def register_attention(register):
        register(Fine)
"""


# --- a plugin that fails to load --------------------------------------------------------
@pytest.mark.parametrize(
    "command", [["list"], ["info", "fine_mod"], ["check", "fine_mod", "-k", "empty"]]
)
def test_every_command_that_resolves_variants_warns_once_per_failed_plugin(
    capsys, write_plugin, command
):
    broken = write_plugin("softcap.py", SYNTAX_ERROR)
    write_plugin("fine_mod.py", GOOD)
    code, _, err = run(capsys, "--plugins-dir", str(broken.parent), *command)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "failed to load" in line]
    assert len(lines) == 1, err
    assert "softcap.py" in lines[0] and "SyntaxError" in lines[0] and "line 8" in lines[0]


def test_check_of_a_name_whose_file_failed_names_the_file_and_its_error(capsys, write_plugin):
    """It said "no attention variant named 'softcap'; did you mean ..." before."""
    broken = write_plugin("softcap.py", SYNTAX_ERROR)
    code, _, err = run(capsys, "--plugins-dir", str(broken.parent), "check", "softcap")
    assert code == 2
    error = err.split("error:", 1)[1]
    assert "did you mean" not in error
    assert f"{broken} failed to load" in error
    assert "SyntaxError" in error and "line 8" in error


def test_registry_get_of_a_name_whose_file_failed_raises_naming_the_file(write_plugin):
    # A file named otherwise that spells the name as a string literal is found too.
    broken = write_plugin("my_experiment.py", SYNTAX_ERROR)
    registry = Registry.discover([broken.parent], entry_points=False, environment=False)
    with pytest.raises(VariantFailedToLoad) as raised:
        registry.get("softcap")
    assert isinstance(raised.value, UnknownVariant)  # callers catching that keep working
    assert str(broken) in str(raised.value) and "SyntaxError" in str(raised.value)
    with pytest.raises(UnknownVariant, match="did you mean 'vanilla'"):
        registry.get("vanila")  # an unrelated typo still gets the suggestion


# --- a --kind mod variant with its own options -------------------------------------------
OWN_CONFIG = """
    from dataclasses import dataclass

    import playground


    @dataclass(frozen=True)
    class PenaltyConfig({base}):
        penalty: float = 0.1


    class Penalised(playground.SoftmaxAttention):
        name, summary, paper = "penalised", "s", "-"
        Config = PenaltyConfig

        def score_mod(self, score, b, h, q_idx, kv_idx):
            return score - self.config.penalty * (q_idx - kv_idx).abs()


    @playground.hookimpl
    def register_attention(register):
        register(Penalised)
"""


def test_a_mod_config_not_derived_from_softmax_attentions_is_refused(write_plugin):
    path = write_plugin("penalised.py", OWN_CONFIG.format(base="playground.VariantConfig"))
    registry = Registry.discover([path.parent], entry_points=False, environment=False)
    assert "penalised" not in registry.names()
    (message,) = [str(error) for error in registry.errors]
    assert "must derive from SoftmaxAttention's config" in message
    assert "SoftmaxConfig" in message and "SoftmaxAttention.Config" in message


def test_a_mod_config_derived_from_softmax_attentions_works(write_plugin):
    path = write_plugin(
        "penalised.py", OWN_CONFIG.format(base="playground.SoftmaxAttention.Config")
    )
    registry = Registry.discover([path.parent], entry_points=False, environment=False)
    module = registry.build("penalised", 32, 4, penalty=0.5, block_size=8)
    assert module.config.penalty == 0.5
    assert module(torch.randn(2, 10, 32)).output.shape == (2, 10, 32)


# --- the suite's own messages ------------------------------------------------------------
class FalselyAdditive(playground.SoftmaxAttention):
    """Declares additive_score_mod, but its score_mod scales the score."""

    name, summary, paper = "falsely_additive", "s", "-"
    additive_score_mod = True

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score * 2.0


class FalselyRelative(FalselyAdditive):
    name = "falsely_relative"
    additive_score_mod = False
    relative_score_mod = True


@pytest.mark.parametrize(
    ("cls", "declaration"),
    [(FalselyAdditive, "additive_score_mod"), (FalselyRelative, "relative_score_mod")],
)
def test_fast_versus_reference_names_a_false_declaration(cls, declaration):
    report = check_attention(cls, checks=[check_fast_matches_reference])
    failure = report.results[0]
    assert failure.verdict == "failed"
    assert "fast and reference" in failure.reason
    assert f"declares {declaration} = True" in failure.reason
    assert "likely cause" in failure.reason


class ContextIsQuery(playground.SoftmaxAttention):
    """context_mod returns the query: key and value never reach the output."""

    name, summary, paper = "context_is_query", "s", "-"

    def context_mod(self, context, query):
        return query.view(*query.shape[:2], self.num_heads, -1).transpose(1, 2)


def test_a_context_mod_returning_the_query_does_not_crash_the_suite():
    """The suite's own comparison raised AttributeError on a missing input gradient."""
    report = check_attention(ContextIsQuery, checks=[check_fast_matches_reference])
    result = report.results[0]
    assert "AttributeError" not in result.reason and "NoneType" not in result.reason
    assert result.verdict == "passed", result.reason  # both paths agree: nothing reaches k, v


class MinusInfinityRow(playground.SoftmaxAttention):
    """Sets every score of query 0 to -inf: a row with no softmax."""

    name, summary, paper = "minus_infinity_row", "s", "-"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return torch.where(q_idx == 0, float("-inf"), score)


def test_a_whole_row_of_minus_infinity_scores_outputs_zero_as_flex_attention_does():
    """Such a row once gave NaN on CPU and the suite called it "NaN on ordinary inputs";
    the core now gives FlexAttention's answer (zeros), on both paths."""
    report = check_attention(
        MinusInfinityRow, checks=[check_output_shape_and_dtype, check_fast_matches_reference]
    )
    assert report.ok, report.failures


# --- playground info does not print a junk state size as a fact ----------------------------
JUNK_STATE = """
    import playground


    class JunkState(playground.SoftmaxAttention):
        name, summary, paper = "junk_state", "s", "-"

        def prefill_state(self, prompt, attention_mask, max_length):
            return prompt, -5


    @playground.hookimpl
    def register_attention(register):
        register(JunkState)
"""


def test_info_reports_a_junk_decoding_state_naming_the_hook(capsys, write_plugin):
    path = write_plugin("junk_state.py", JUNK_STATE)
    code, out, _ = run(capsys, "--plugins-dir", str(path.parent), "info", "junk_state")
    assert code == 0
    flat = " ".join(out.split())
    assert "MiB" not in flat
    assert "prefill_state() hook returned int as its state" in flat
