"""LoadOptions: the one way the options that say how MODEL loads travel (issue 23)."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

import ssacli
from ssacli.models.loading import load_with
from ssacli.models.options import LoadOptions


@pytest.mark.parametrize(
    "function",
    [
        ssacli.load_model,
        ssacli.diagnose,
        ssacli.convert,
        ssacli.compare_models,
        ssacli.lm_eval,
        ssacli.finetune,
        ssacli.convert_and_finetune,
    ],
)
def test_every_api_function_that_loads_a_model_has_load_options_defaults(function):
    parameters = inspect.signature(function).parameters
    shared = [f for f in dataclasses.fields(LoadOptions) if f.name in parameters]
    # a keyword wrapper that takes **settings passes them to LoadOptions itself (issue 53)
    takes_settings = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    assert shared or takes_settings, function.__name__
    for field in shared:
        assert parameters[field.name].default == field.default, (function.__name__, field.name)


def test_load_model_and_convert_take_every_load_option():
    every = {f.name: f.default for f in dataclasses.fields(LoadOptions)}
    for function in (ssacli.load_model, ssacli.diagnose, ssacli.convert, ssacli.compare_models):
        parameters = inspect.signature(function).parameters
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):  # **settings: taken, or a TypeError
            model = "/nonexistent/model"
            args = (model, model) if function is ssacli.compare_models else (model,)
            with pytest.raises(ssacli.InputError, match=model):
                function(*args, **every, **({"scorer": "ssa"} if function is ssacli.convert else {}))
        else:
            assert set(every) <= set(parameters), function.__name__


def test_no_max_memory_is_none_and_allow_download_is_deprecated():
    options = LoadOptions(device="cpu", dtype="float64", allow_pickle=True, max_memory=[])  # no --max-memory
    assert options == LoadOptions(device="cpu", dtype="float64", allow_pickle=True)
    assert options.max_memory is None
    with pytest.warns(DeprecationWarning, match="allow_download is deprecated and has no effect"):
        assert LoadOptions(allow_download=True) == LoadOptions()
    assert "allow_download" not in LoadOptions().keywords()
    assert options.keywords() == {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.device = "cuda"  # type: ignore[misc]


def test_load_options_import_no_torch():
    code = "import sys, ssacli.models.options, ssacli.cli.options; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_bad_option_is_refused_when_the_model_loads():
    with pytest.raises(ssacli.SsacliError, match="--max-memory limits a --device-map placement"):
        load_with("builtin:every-softmax", LoadOptions(max_memory="cpu=1GB"))
