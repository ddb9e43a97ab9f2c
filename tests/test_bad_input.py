"""Bad input gets a clear error that names the problem and what to do."""

from __future__ import annotations

import pytest
import torch

import playground
from playground import ConfigError, InvalidInput, UnsupportedFeature


@pytest.fixture
def module():
    return playground.build("vanilla", d_model=16, num_heads=4)


def test_d_model_not_divisible_by_heads():
    with pytest.raises(ConfigError, match=r"d_model \(10\) must be divisible by num_heads \(4\)"):
        playground.build("vanilla", d_model=10, num_heads=4)


def test_non_positive_sizes():
    with pytest.raises(ConfigError, match="num_heads must be a positive integer"):
        playground.build("vanilla", d_model=16, num_heads=0)


def test_wrong_rank(module):
    with pytest.raises(InvalidInput, match=r"batch first; got \(5, 16\).*unsqueeze\(0\)"):
        module(torch.randn(5, 16))


def test_wrong_width(module):
    with pytest.raises(InvalidInput, match=r"d_model=16.*got \(2, 5, 12\)"):
        module(torch.randn(2, 5, 12))


def test_key_value_length_mismatch(module):
    with pytest.raises(InvalidInput, match="key and value must have the same sequence length"):
        module(torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(2, 6, 16))


def test_batch_mismatch(module):
    with pytest.raises(InvalidInput, match="same batch size"):
        module(torch.randn(2, 5, 16), torch.randn(3, 5, 16))


def test_integer_input(module):
    with pytest.raises(InvalidInput, match="floating"):
        module(torch.ones(2, 5, 16, dtype=torch.long))


def test_mask_of_wrong_shape(module):
    with pytest.raises(InvalidInput, match=r"\(batch, key_len\) = \(2, 5\).*got \(2, 4\)"):
        module(torch.randn(2, 5, 16), attention_mask=torch.ones(2, 4, dtype=torch.bool))


def test_mask_of_wrong_dtype_says_how_to_convert(module):
    with pytest.raises(InvalidInput, match=r"got \(2, 5\) torch.int64.*mask.bool\(\)"):
        module(torch.randn(2, 5, 16), attention_mask=torch.ones(2, 5, dtype=torch.long))


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"no option 'windw'; valid options: impl, bias, dropout"):
        playground.build("vanilla", windw=3)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("bias", 1, "must be bool"),
        ("dropout", "0.1", "must be a number"),
        ("impl", "fastest", "must be one of 'fast', 'reference'"),
    ],
)
def test_option_of_wrong_type(option, value, message):
    with pytest.raises(ConfigError, match=message):
        playground.build("vanilla", **{option: value})


def test_option_of_invalid_value():
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\); got 1.5"):
        playground.build("vanilla", dropout=1.5)


def test_integer_is_accepted_for_a_float_option():
    assert playground.build("vanilla", dropout=0).config.dropout == 0.0


def test_extra_forward_argument_of_another_variant(module):
    with pytest.raises(UnsupportedFeature, match=r"global_attention_mask.*none"):
        module(torch.randn(1, 4, 16), global_attention_mask=torch.ones(1, 4, dtype=torch.bool))


def test_undeclared_feature_names_variant_and_feature():
    from tests.broken_variants import SelfAttentionOnly

    module = SelfAttentionOnly(d_model=16, num_heads=4)
    with pytest.raises(
        UnsupportedFeature, match="variant 'self_attention_only' does not support causal"
    ):
        module(torch.randn(1, 4, 16), is_causal=True)


# --- padded positions, flags, mismatches, empty inputs ----------------------------
def _padding_case(name):
    """A module of `name` (both impls, same weights), inputs and a mask with padding."""
    cls = playground.get_variant(name)
    modules = []
    for impl in ("fast", "reference"):
        torch.manual_seed(0)
        modules.append(cls(d_model=16, num_heads=2, **{**cls.suite_options, "impl": impl}).eval())
    x = torch.randn(3, 12, 16)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 8:] = False
    mask[2, :2] = False
    return modules, x, mask


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", playground.list_variants())
def test_non_finite_padding_never_reaches_real_outputs(name, fill):
    if not playground.get_variant(name).capabilities.padding_mask:
        pytest.skip(f"{name} declares no padding mask")
    modules, x, mask = _padding_case(name)
    poisoned = torch.where(mask[..., None], x, fill)
    for module in modules:
        cases = [{}] + ([{"is_causal": True}] if module.capabilities.causal else [])
        for case in cases:
            with torch.no_grad():
                clean = module(x, attention_mask=mask, **case).output
                dirty = module(poisoned, attention_mask=mask, **case).output
            assert torch.isfinite(dirty[mask]).all(), (module.config.impl, case)
            assert torch.equal(clean[mask], dirty[mask]), (module.config.impl, case)


def test_without_the_core_clearing_padding_the_suite_catches_the_nan(monkeypatch):
    """The check that guards non-finite padding can fail: switch the core's clearing off
    and vanilla's real outputs turn NaN (0 · NaN in the weighted sum)."""
    from playground import contract
    from playground.testing import check_attention
    from playground.testing.checks import check_padding_invariance

    monkeypatch.setattr(contract, "clear_non_finite_padding", lambda q, k, v, mask: (q, k, v))
    report = check_attention("vanilla", checks=[check_padding_invariance])
    (failure,) = {r.reason for r in report.failures if r.impl == "fast"} or {None}
    assert failure is not None and "NaN" in failure and "non-finite" in failure


@pytest.mark.parametrize("flag", ["is_causal", "need_weights"])
@pytest.mark.parametrize("value", ["False", 1, None, torch.tensor(True)])
def test_flags_must_be_bools(module, flag, value):
    with pytest.raises(InvalidInput, match=rf"{flag} must be True or False"):
        module(torch.randn(1, 4, 16), **{flag: value})


@pytest.mark.parametrize(
    ("module_dtype", "input_dtype", "name"),
    [
        (torch.float32, torch.float64, "vanilla"),
        (torch.bfloat16, torch.float32, "vanilla"),
        (torch.float32, torch.float16, "vanilla"),
        (torch.float32, torch.float64, "t5_relative"),
    ],
)
def test_module_and_input_dtypes_must_match(module_dtype, input_dtype, name):
    module = playground.build(name, d_model=16, num_heads=4).to(module_dtype)
    with pytest.raises(InvalidInput, match=rf"input is {input_dtype}.*are {module_dtype}"):
        module(torch.randn(1, 4, 16, dtype=input_dtype))


def test_module_and_input_devices_must_match():
    module = playground.build("vanilla", d_model=16, num_heads=4).to("meta")
    with pytest.raises(InvalidInput, match=r"input is on cpu but the parameters .* on meta"):
        module(torch.randn(1, 4, 16))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)], ids=["batch-0", "length-0"])
@pytest.mark.parametrize("name", playground.list_variants())
def test_empty_inputs_give_the_same_empty_result_in_both_paths(name, shape):
    cls = playground.get_variant(name)
    x = torch.randn(*shape, 16)
    outputs = []
    for impl in ("fast", "reference"):
        module = cls(d_model=16, num_heads=2, **{**cls.suite_options, "impl": impl})
        result = module(x, need_weights=module.capabilities.need_weights)
        outputs.append(result)
        assert result.output.shape == x.shape
        if module.capabilities.need_weights:
            assert result.weights.shape == (shape[0], 2, shape[1], shape[1])
    assert torch.equal(outputs[0].output, outputs[1].output)


def test_no_key_at_all_outputs_zeros():
    module = playground.build("vanilla", d_model=16, num_heads=4)
    x = torch.randn(2, 3, 16, requires_grad=True)
    result = module(x, x[:, :0], x[:, :0], need_weights=True)
    assert result.output.shape == (2, 3, 16) and result.output.abs().max() == 0
    assert result.weights.shape == (2, 4, 3, 0)
    result.output.sum().backward()  # stays in the graph, with a zero gradient
    assert x.grad.abs().max() == 0


# --- options that cannot be built --------------------------------------------------
@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("longformer", {"attention_window": 10**20}, r"'attention_window'.*64-bit integer"),
        ("linformer", {"seq_len": 10**12}, r"seq_len=1000000000000.*do not fit in memory"),
        ("vanilla", {"d_model": 2**40}, r"d_model=1099511627776.*do not fit in memory"),
        ("t5_relative", {"num_buckets": -(2**70)}, r"'num_buckets'.*64-bit integer"),
    ],
)
def test_options_that_cannot_be_built_are_a_config_error_naming_them(name, options, message):
    options = {"d_model": 32, "num_heads": 4, **options}
    with pytest.raises(ConfigError, match=message):
        playground.build(name, **options)


def test_duplicate_global_tokens_count_once():
    twice = playground.build("longformer", d_model=32, num_heads=4, global_tokens=[3, 0, 3])
    once = playground.build("longformer", d_model=32, num_heads=4, global_tokens=[0, 3])
    assert twice.config.global_tokens == (0, 3)
    assert twice.count_flops(64, 64) == once.count_flops(64, 64)
    x = torch.randn(1, 16, 32)
    twice.load_state_dict(once.state_dict())
    assert torch.equal(twice(x).output, once(x).output)


def test_check_attention_of_something_that_is_not_a_variant_is_a_clear_error():
    from playground.testing import check_attention

    with pytest.raises(ConfigError, match=r"registered variant name .* or an AttentionVariant"):
        check_attention(123)
