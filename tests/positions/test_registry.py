"""The registry: names, options and plugins, with errors that say what is allowed."""

from __future__ import annotations

import pytest

from pe_bench.errors import UserError
from pe_bench.positions import build_scheme, registered
from tests.helpers import NOT_RELATIVE, RELATIVE, TRAINABLE, VARIANTS


def test_every_card_scheme_is_registered():
    assert set(TRAINABLE + VARIANTS) <= set(registered())


def test_relative_flags_match_the_card():
    assert set(RELATIVE) | set(NOT_RELATIVE) == set(TRAINABLE + VARIANTS)
    assert {name for name, cls in registered().items() if cls.relative} >= set(RELATIVE)
    assert not any(registered()[n].relative for n in NOT_RELATIVE)


def test_content_dependent_biases_are_declared():
    content = {name for name, cls in registered().items() if cls.content_bias}
    assert content >= {"xl", "shaw", "cope"}
    assert not content & {"alibi", "t5", "kerple_log", "kerple_power", "fire", "sandwich"}


def test_variants_declare_what_they_apply_to():
    assert {n: registered()[n].variant_of for n in VARIANTS} == dict.fromkeys(VARIANTS, "rope")
    assert not any(registered()[n].variant_of for n in TRAINABLE)


def test_unknown_scheme_lists_the_registered_ones(dims):
    with pytest.raises(UserError, match=r"unknown scheme 'ropee'; registered: .*alibi.*rope"):
        build_scheme({"name": "ropee"}, dims)


def test_unknown_option_lists_the_allowed_ones(dims):
    with pytest.raises(UserError, match=r"scheme 'rope' has no option bsae; allowed: base"):
        build_scheme({"name": "rope", "bsae": 10.0}, dims)


def test_plugin_that_does_not_import(dims):
    with pytest.raises(UserError, match=r"pe.plugin='no_such_pkg.mod' does not import"):
        build_scheme({"name": "x", "plugin": "no_such_pkg.mod"}, dims)


def test_options_are_checked_for_type_and_range(dims):
    with pytest.raises(UserError, match=r"pe.base='abc' must be a number"):
        build_scheme({"name": "rope", "base": "abc"}, dims)
    with pytest.raises(UserError, match=r"eval.variants.pi.factor must be >= 1, got 0.5"):
        build_scheme({"name": "pi", "factor": 0.5}, dims, "eval.variants.pi.")
    with pytest.raises(UserError, match=r"pe.init_c must be > 0, got 0.0"):
        build_scheme({"name": "fire", "init_c": 0}, dims)
    assert build_scheme({"name": "pi", "factor": 4}, dims).factor == 4.0  # coerced as config


def test_a_plugin_that_raises_is_one_line(dims):
    with pytest.raises(UserError, match=r"raised in __init__ with options \{\}: ValueError"):
        build_scheme({"name": "init_raises", "plugin": "tests.plugins.init_raises"}, dims)
    with pytest.raises(UserError, match=r"does not import: RuntimeError: cannot reach"):
        build_scheme({"name": "x", "plugin": "tests.plugins.raises_at_import"}, dims)
    with pytest.raises(UserError, match=r"TypeError: @register\('not_a_scheme'\) needs a Pos"):
        build_scheme({"name": "x", "plugin": "tests.plugins.not_a_scheme"}, dims)


# Issue 38: each new label's caveat says what differs from its paper and what this small
# model cannot show (the paper's scale), so both travel with its records.
NEW_LABEL_CAVEATS = {
    "pope": ("PoPE-pytorch", "124M-774M parameters"),
    "fope": ("authors' code", "60M-1.2B parameters"),
    "bipe": ("BiPE's code", "151M and 1.6B parameters"),
    "bipe_alibi": ("BiPE's code", "151M and 1.6B parameters"),
    "cable": ("authors' code", "44M-334M parameters"),
    "path": ("fla's PaTHAttention", "far larger than this one"),
    "nope_temp": ("bfloat16", "TinyLlama 1.1B"),
}


@pytest.mark.parametrize("name", sorted(NEW_LABEL_CAVEATS))
def test_new_labels_caveats_say_what_differs_and_what_the_scale_hides(name, dims):
    caveat = build_scheme({"name": name}, dims).caveat
    differs, scale = NEW_LABEL_CAVEATS[name]
    assert differs in caveat and scale in caveat
