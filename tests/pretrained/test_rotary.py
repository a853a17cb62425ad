"""Rotary scalings as transformers defines them: closed forms of the rates and factors,
which field wins, and the errors that name a bad one."""

import math

import numpy as np
import pytest

from beyondpar.pretrained import rotary

LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 2.0],
    "long_factor": [3.0, 5.0],
}
PHI3 = {"max_position_embeddings": 128, "original_max_position_embeddings": 32}


def default_rates(theta, dim):
    return 1 / theta ** (np.arange(0, dim, 2) / dim)


def test_linear_divides_every_rate_by_its_factor():
    rope = rotary.Rope.from_params({"rope_type": "linear", "factor": 4.0}, {}, ("linear",), 1e6)
    np.testing.assert_allclose(rope.inverse_frequencies(16), default_rates(1e6, 16) / 4, rtol=1e-6)


def test_frequency_factors_divide_the_rates_beside_a_linear_scaling():
    """llama.cpp's per-rate divisors (GGUF `rope_freqs`) stay beside a linear scaling,
    which a GGUF with partial rotary gets (linear by 1)."""
    config = {"rope_freq_factors": [1.0, 2.0, 4.0, 8.0], "rope_theta": 1e4}
    for factor in (1.0, 2.0):
        params = {"rope_type": "linear", "factor": factor}
        rope = rotary.Rope.from_params(params, config, ("linear",))
        want = default_rates(1e4, 8) / np.asarray(config["rope_freq_factors"]) / factor
        np.testing.assert_allclose(rope.inverse_frequencies(8), want, rtol=1e-6)


def test_longrope_takes_short_factors_up_to_the_original_length_then_long_ones():
    """Transformers switches when the text is longer than
    original_max_position_embeddings: 32 tokens are short, 33 long."""
    rope = rotary.Rope.from_params(LONGROPE, PHI3, ("longrope",))
    base = default_rates(10000.0, 4)
    np.testing.assert_allclose(rope.inverse_frequencies(4, 32), base / [1.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(rope.inverse_frequencies(4, 33), base / [3.0, 5.0], rtol=1e-6)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(32)))


@pytest.mark.parametrize(
    "params,config,factor",
    [
        ({"attention_factor": 0.7}, PHI3, 0.7),  # given: used as is
        ({"factor": 2.0}, PHI3, math.sqrt(1 + math.log(2) / math.log(32))),
        ({}, {"max_position_embeddings": 32}, 1.0),  # max / 4096 <= 1: no factor
    ],
)
def test_longrope_attention_factor(params, config, factor):
    rope = rotary.Rope.from_params({**LONGROPE, **params}, config, ("longrope",))
    assert rope.attention_factor == pytest.approx(factor)


def test_rope_scaling_wins_over_rope_parameters_and_top_level_fields_fill_in():
    config = {
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 5.0},
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.5,
    }
    rope = rotary.Rope.from_hf(config, ("default", "linear"))
    assert (rope.kind, rope.factor, rope.theta, rope.partial_factor) == ("linear", 2.0, 500.0, 0.5)


@pytest.mark.parametrize(
    "params,message",
    [
        (
            {"rope_type": "yarn"},
            r"'rope_type' must be one of \['default', 'longrope'\], got 'yarn'",
        ),
        ({**LONGROPE, "short_factor": 1.0}, r"'short_factor' must be a list of positive numbers"),
        ({**LONGROPE, "long_factor": [1.0, -2.0]}, r"'long_factor' must be a list of positive"),
        ({"partial_rotary_factor": 1.5}, r"'partial_rotary_factor' must be a number in \(0, 1\]"),
    ],
)
def test_bad_rope_fields_are_named(params, message):
    with pytest.raises(ValueError, match=message):
        rotary.Rope.from_params(params, PHI3, ("default", "longrope"))


def test_a_wrong_number_of_longrope_factors_is_named():
    rope = rotary.Rope.from_params(LONGROPE, PHI3, ("longrope",))
    with pytest.raises(ValueError, match=r"'long_factor' must number 4 \(rotary dim / 2\), got 2"):
        rope.inverse_frequencies(8, 64)


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def test_llama3_keeps_short_wavelengths_slows_long_ones_and_blends_between():
    """Wavelengths below original / high_freq_factor (16) keep their rate, those above
    original / low_freq_factor (64) are divided by the factor, and between them the
    rate is inv * ((1 - s) / factor + s) with s = (original / wavelength - low) /
    (high - low)."""
    rope = rotary.Rope.from_params(LLAMA3, {}, ("llama3",))
    inv = default_rates(10000.0, 16)
    wavelength = 2 * np.pi / inv
    smooth = (64 / wavelength - 1.0) / 3.0
    blended = inv * ((1 - smooth) / 8.0 + smooth)
    want = np.where(wavelength < 16, inv, np.where(wavelength > 64, inv / 8.0, blended))
    assert ((wavelength >= 16) & (wavelength <= 64)).sum() == 2  # the blend is checked
    np.testing.assert_allclose(rope.inverse_frequencies(16), want, rtol=1e-6)


def test_a_rope_dicts_own_base_wins_over_the_top_level_one():
    """transformers 5 keeps `rope_theta` inside `rope_parameters`; a top-level one (older
    configs) only fills in when the dict names none."""
    inner = {"rope_parameters": {"rope_type": "default", "rope_theta": 5.0}, "rope_theta": 500.0}
    assert rotary.Rope.from_hf(inner, ("default",)).theta == 5.0
    outer = {"rope_parameters": {"rope_type": "default"}, "rope_theta": 500.0}
    assert rotary.Rope.from_hf(outer, ("default",)).theta == 500.0


def yarn_rates(theta, dim, factor, original, fast=32.0, slow=1.0, truncate=True):
    """YaRN's rates in closed form (arXiv 2309.00071, as transformers defines them): the
    rates that turn more than `fast` times over the original length kept, fewer than
    `slow` times divided by `factor`, blended linearly between."""
    index = lambda turns: dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))
    low, high = index(fast), index(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low + (0.001 if low == high else 0)), 0, 1)
    rates = default_rates(theta, dim)
    return rates / factor * ramp + rates * (1 - ramp)


@pytest.mark.parametrize(
    "params,config,dim,factor,attention",
    [
        ({"factor": 4.0, "beta_fast": 16.0}, {}, 16, 4.0, 0.1 * math.log(4) + 1),
        ({"factor": 4.0, "beta_fast": 16.0, "truncate": False}, {}, 16, 4.0, 0.1 * math.log(4) + 1),
        ({"factor": None}, {"max_position_embeddings": 128}, 16, 4.0, 0.1 * math.log(4) + 1),
        (
            {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5},
            {},
            32,
            8.0,
            (0.1 * math.log(8) + 1) / (0.05 * math.log(8) + 1),
        ),
        ({"factor": 2.0, "attention_factor": 0.9}, {"partial_rotary_factor": 0.5}, 8, 2.0, 0.9),
    ],
)
def test_yarn_rates_and_attention_factor(params, config, dim, factor, attention):
    """Rates on a head of 16 features (8 of them turning with a partial factor of a half,
    32 for the mscale case) against the closed form, ramp ends truncated or not; the
    factor from the lengths when null; the attention factor 0.1 ln(s) + 1, a ratio of two
    with mscale and mscale_all_dim, or as given."""
    params = {"rope_type": "yarn", "original_max_position_embeddings": 32, **params}
    rope = rotary.Rope.from_params(params, config, ("yarn",), 1e4)
    head_dim = 32 if "mscale" in params else 16
    truncate = params.get("truncate", True)
    want = yarn_rates(1e4, dim, factor, 32, params.get("beta_fast", 32.0), truncate=truncate)
    np.testing.assert_allclose(rope.inverse_frequencies(head_dim), want, rtol=1e-6)
    assert rope.attention_factor == pytest.approx(attention, rel=1e-12)


def test_yarn_ramp_ends_are_clamped_to_the_rotary_dimension_not_the_rate_count():
    """Transformers clamps the ramp's upper end to rotary dim - 1 (15 for 16 features),
    not to the last of the 8 rates. Base 100 over 4096 tokens puts the ends at
    floor(5.24) = 5 and ceil(11.26) = 12: rates 6 and 7 are 1/7 and 2/7 of the way to
    the interpolated ones, so with factor 4 they are 1 - 3/28 and 1 - 6/28 of the
    unscaled rates, the first six unchanged. Base 10 puts both ends past the rates (10
    and 15): every rate is kept."""
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    rope = rotary.Rope.from_params(params, {}, ("yarn",), 100.0)
    ratio = rope.inverse_frequencies(16) / default_rates(100.0, 16)
    np.testing.assert_allclose(ratio, [1.0] * 6 + [25 / 28, 22 / 28], rtol=1e-6)
    np.testing.assert_allclose(
        rope.inverse_frequencies(16), yarn_rates(100.0, 16, 4.0, 4096), rtol=1e-6
    )
    rope = rotary.Rope.from_params(params, {}, ("yarn",), 10.0)
    np.testing.assert_allclose(rope.inverse_frequencies(16), default_rates(10.0, 16), rtol=1e-6)
    np.testing.assert_allclose(
        rope.inverse_frequencies(16), yarn_rates(10.0, 16, 4.0, 4096), rtol=1e-6
    )


def test_a_null_share_falls_back_to_the_next_place_that_gives_one():
    """Null counts as absent: the rope dict's null share falls back to the top-level one,
    a null top-level one to a whole head."""
    name = "partial_rotary_factor"
    assert rotary.partial_rotary_factor({name: None}, {name: 0.5}, name) == 0.5
    assert rotary.partial_rotary_factor({}, {name: None}, name) == 1.0
    assert rotary.partial_rotary_factor({name: 0.25}, {name: 0.5}, name) == 0.25


def test_a_partial_share_rounds_the_rotating_features_down():
    """int(head_dim * share), as transformers rounds it: a share of 0.4 of 12 features
    turns 4 of them (2 rates over a rotary dimension of 4), not 5."""
    rope = rotary.Rope(theta=500.0, partial_factor=0.4)
    np.testing.assert_allclose(rope.inverse_frequencies(12), default_rates(500.0, 4), rtol=1e-6)
    rope = rotary.Rope(theta=500.0, partial_factor=0.7)  # 7.7 of 11 features: 7, so 3 rates
    np.testing.assert_allclose(rope.inverse_frequencies(11), default_rates(500.0, 7), rtol=1e-6)


def test_longrope_original_length_is_4096_when_the_config_gives_none():
    """Transformers' Phi-3 config takes 4096 as the original context when
    original_max_position_embeddings is absent: with 16384 positions the scale is 4,
    the attention factor sqrt(1 + ln 4 / ln 4096), and 4096 tokens still use the short
    factors while 4097 use the long ones."""
    rope = rotary.Rope.from_params(LONGROPE, {"max_position_embeddings": 16384}, ("longrope",))
    assert rope.original_max_len == 4096
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(4096)))
    base = default_rates(10000.0, 4)
    np.testing.assert_allclose(rope.inverse_frequencies(4, 4096), base / [1.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(rope.inverse_frequencies(4, 4097), base / [3.0, 5.0], rtol=1e-6)


def test_a_top_level_original_length_wins_over_the_rope_dicts_own():
    """Transformers standardises a scaled rope's pretraining context from the top-level
    `original_max_position_embeddings` first, the rope dict's only when that is absent.
    With the top-level 16 (the dict says 64) llama3 keeps wavelengths below 16 / 4 = 4,
    blends those between 4 and 16 and divides the rest by the factor: on 16 features the
    first rate (wavelength 2 pi) is blended with s = (16 / (2 pi) - 1) / 3 and the other
    seven are divided by 8. YaRN's ramp ends move with the same length."""
    config = {"original_max_position_embeddings": 16, "max_position_embeddings": 1024}
    rope = rotary.Rope.from_params(LLAMA3, config, ("llama3",))
    assert rope.original_max_len == 16
    inv = default_rates(10000.0, 16)
    smooth = (16 / (2 * np.pi) - 1.0) / 3.0
    want = np.concatenate([[(1 - smooth) / 8.0 + smooth], inv[1:] / 8.0])
    np.testing.assert_allclose(rope.inverse_frequencies(16), want, rtol=1e-6)

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    config = {"original_max_position_embeddings": 4096, "max_position_embeddings": 16384}
    rope = rotary.Rope.from_params(yarn, config, ("yarn",), 1e4)
    want = yarn_rates(1e4, 16, 4.0, 4096)
    assert not np.allclose(want, yarn_rates(1e4, 16, 4.0, 32), rtol=1e-3)
    np.testing.assert_allclose(rope.inverse_frequencies(16), want, rtol=1e-6)


@pytest.mark.parametrize("given", [{"mscale": 2.0}, {"mscale_all_dim": 0.5}])
def test_yarn_with_only_one_mscale_takes_the_plain_attention_factor(given):
    """Transformers takes the ratio of two mscales only when both `mscale` and
    `mscale_all_dim` are set; with one of them alone the attention factor is the plain
    0.1 ln(s) + 1 (s = 8 here)."""
    params = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, **given}
    rope = rotary.Rope.from_params(params, {}, ("yarn",), 1e4)
    assert rope.attention_factor == pytest.approx(0.1 * math.log(8) + 1, rel=1e-12)


def test_yarn_ramp_whose_ends_meet_is_widened_not_divided_by_zero():
    """Over an original length of 8 the rate that turns beta_slow = 2 times has index
    16 ln(8 / (4 pi)) / (2 ln 1e4) < 0, so both ramp ends clamp to 0; transformers then
    widens the ramp by 0.001: the first rate (index 0) is kept, the seven others are
    divided by the factor 4, and no rate is NaN."""
    params = {
        "rope_type": "yarn",
        "factor": 4.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 8,
    }
    rope = rotary.Rope.from_params(params, {}, ("yarn",), 1e4)
    inv = default_rates(1e4, 16)
    got = rope.inverse_frequencies(16)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, np.concatenate([inv[:1], inv[1:] / 4.0]), rtol=1e-6)


def test_a_rope_dicts_own_share_wins_over_the_top_level_one():
    """The rope dict's `partial_rotary_factor` (0.25) wins over the top-level one (0.5):
    4 of 16 features turn, 2 rates 1e4^(-2i/4); the top-level share only fills in when
    the dict names none (8 features, 4 rates)."""
    name = "partial_rotary_factor"
    both = {"rope_parameters": {"rope_type": "default", name: 0.25}, name: 0.5}
    rope = rotary.Rope.from_hf(both, ("default",))
    np.testing.assert_allclose(rope.inverse_frequencies(16), default_rates(1e4, 4), rtol=1e-6)
    outer = {"rope_parameters": {"rope_type": "default"}, name: 0.5}
    rope = rotary.Rope.from_hf(outer, ("default",))
    np.testing.assert_allclose(rope.inverse_frequencies(16), default_rates(1e4, 8), rtol=1e-6)


def test_yarn_ramp_spans_from_rate_zero_to_rotary_dim_minus_one_when_both_ends_clamp():
    """Base 10 over 4096 tokens on 16 features: the rate turning beta_slow = 1 time has
    index 8 log10(4096 / (2 pi)) = 22.5, ceiled to 23 and clamped to 15; with
    beta_fast = 1000 the lower end 8 log10(4096 / (2000 pi)) < 0 clamps to 0. Rate i is
    then i / 15 of the way to the interpolated one: with factor 4 it is 1 - i / 20 of
    the unscaled rate."""
    params = {
        "rope_type": "yarn",
        "factor": 4.0,
        "beta_fast": 1000.0,
        "original_max_position_embeddings": 4096,
    }
    rope = rotary.Rope.from_params(params, {}, ("yarn",), 10.0)
    ratio = rope.inverse_frequencies(16) / default_rates(10.0, 16)
    np.testing.assert_allclose(ratio, 1 - np.arange(8) / 20, rtol=1e-6)
