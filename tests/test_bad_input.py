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
