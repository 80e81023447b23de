"""DiagnoseSettings: diagnose's settings as one frozen value, checked in one place (issue 23)."""

from __future__ import annotations

import dataclasses

import pytest

import ssacli
from ssacli import defaults
from ssacli.diagnosis.run import diagnose
from ssacli.diagnosis.settings import DiagnoseSettings
from ssacli.errors import UsageError


def test_diagnose_takes_its_settings_by_name_and_refuses_any_other_keyword():
    # the keyword wrapper builds DiagnoseSettings and LoadOptions from its keywords: their defaults
    # are the fields', said once (issue 53); a keyword neither has is Python's own TypeError
    assert DiagnoseSettings().samples == defaults.SAMPLES and DiagnoseSettings().stats == defaults.STATS
    with pytest.raises(TypeError, match=r"^diagnose\(\) got an unexpected keyword argument 'samplez'$"):
        diagnose("/nonexistent/model", samplez=2)
    with pytest.raises(ssacli.SsacliError, match="/nonexistent/model"):  # the settings were taken
        diagnose("/nonexistent/model", samples=2, device="cpu", scorer="softmax", generate=1)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"samples": 0}, "samples must be >= 1, got 0"),
        ({"batch_size": 0}, "batch-size must be >= 1, got 0"),
        ({"block_size": -1}, "block-size must be >= 1, got -1"),
        ({"stats": "fast"}, "--stats takes auto, eager, fused, got 'fast'"),
        ({"tau": 1.5}, "tau must be in (0, 1], got 1.5"),
        ({"tau": 0}, "tau must be in (0, 1], got 0"),
        ({"top_k": 0}, "top-k must be >= 1, got 0"),
    ],
)
def test_a_bad_setting_is_one_usage_error_before_any_model_loads(bad, words):
    with pytest.raises(UsageError) as caught:
        DiagnoseSettings(**bad)
    assert str(caught.value) == words
    with pytest.raises(UsageError) as caught:  # diagnose checks them first: a model that is not there
        diagnose("/nonexistent/model", **bad)
    assert str(caught.value) == words


def test_settings_are_frozen_and_a_changed_copy_is_checked_again():
    settings = DiagnoseSettings(samples=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.samples = 2  # type: ignore[misc]
    assert dataclasses.replace(settings, samples=2).samples == 2
    with pytest.raises(UsageError, match="samples must be >= 1"):
        dataclasses.replace(settings, samples=0)


def test_the_base_length_is_the_given_one_or_the_kinds_default():
    assert DiagnoseSettings().base_length(icl=True) == defaults.ICL_POINTS
    assert DiagnoseSettings().base_length(icl=False) == defaults.PROBE_LENGTH
    assert DiagnoseSettings(length=12).base_length(icl=True) == 12


@pytest.mark.parametrize(
    ("wrapper", "args"),
    [
        (ssacli.attribute, ("/nonexistent/model", "key-scale:1,8")),
        (ssacli.train_from_scratch, ("d.txt", "out")),
    ],
    ids=["attribute", "train_from_scratch"],
)
def test_every_keyword_wrapper_refuses_a_keyword_no_settings_value_has(wrapper, args):
    # the other keyword wrappers split their keywords as diagnose does: an unknown one is Python's
    # own TypeError naming the function, before anything is read or written
    with pytest.raises(
        TypeError, match=rf"^{wrapper.__name__}\(\) got an unexpected keyword argument 'stepz'$"
    ):
        wrapper(*args, stepz=2)


def test_attribute_gives_each_keyword_to_the_value_that_has_it():
    # heads as the caller writes them (lists) reach AttributionSettings as tuples; samples, the
    # inputs' setting, reaches the inputs (a nonexistent model: refused after the settings were taken)
    with pytest.raises(ssacli.SsacliError, match="/nonexistent/model"):
        ssacli.attribute("/nonexistent/model", "key-scale:1,8", heads=[[0, 1]], samples=4, device="cpu")
    assert ssacli.AttributionSettings(heads=[[0, 1]], remedy=[2.0]).heads == ((0, 1),)
