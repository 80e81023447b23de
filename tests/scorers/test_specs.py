"""The scorers' declarations have one owner, the torch-free table in ssacli.scorers.specs: every
registered torch class takes its name, summary, traits, options and trainable parameters from it,
and a spec is checked against it, values included, without torch (issue 36: input checked in a
second)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from ssacli.errors import SpecError
from ssacli.scorers import (
    DECLARATIONS,
    SCORERS,
    Scorer,
    Traits,
    make_scorer,
    parse_spec,
    registration,
    registry,
    specs,
)
from tests.scorers.test_scorers import BAD_SPECS

# value rules beyond each option's type (the rules the classes applied in __init__ before)
RULE_SPECS = [
    "ssa:preset=paper,init=paper",
    "ssa:init=faithful,m=1e-10",  # n = m below the positive floor
    "ssa:init=faithful,m=1e10",
    "ssa:init=authors,learn=x",
    "ssa:b=0",
    "temperature:t=-1",
    "entmax:alpha=0.5",
    "relu-norm:power=0",
]


def test_every_registered_scorer_takes_its_declaration_from_the_table():
    assert list(SCORERS) == list(DECLARATIONS)  # one class per declaration, in the table's order
    for name, cls in SCORERS.items():
        declared = DECLARATIONS[name]
        assert cls.declared is declared and cls.declaration() is declared, name
        assert cls.name == declared.name == name
        assert (cls.summary, cls.traits, cls.uses_qk) == (declared.summary, declared.traits, declared.uses_qk)
        assert cls.options is declared.options, name  # the same dict: not restated
        assert cls.trainable == declared.trainable, name
        defaults = {k: o.default for k, o in declared.options.items()}
        assert make_scorer(name).opts.keys() == defaults.keys(), name
        for public in declared.trainable:
            assert f"{public}_raw" in dict(make_scorer(name).named_parameters()), (name, public)


def test_no_scorer_module_restates_a_declaration():
    for module in {sys.modules[cls.__module__] for cls in SCORERS.values()}:
        source = inspect.getsource(module)
        for restated in ("Option(", "Traits(", "summary =", "options =", "trainable =", "name = "):
            assert restated not in source, (module.__name__, restated)


@pytest.mark.parametrize("spec", BAD_SPECS + RULE_SPECS)
def test_a_spec_is_refused_by_its_declaration_as_the_scorer_would_refuse_it(spec):
    with pytest.raises(SpecError) as parsed:
        parse_spec(spec)
    with pytest.raises(SpecError) as built:
        make_scorer(spec)
    assert str(parsed.value) == str(built.value)


def test_keyword_arguments_meet_the_same_rules():
    with pytest.raises(SpecError, match="t must be > 0"):
        SCORERS["temperature"](t=0.0)
    with pytest.raises(SpecError, match="m only applies to init=faithful"):
        SCORERS["ssa"](m=256.0)


def test_specs_are_checked_without_torch():
    code = (
        "import sys\n"
        "from ssacli.scorers import parse_spec, scorer_table\n"
        "assert parse_spec('ssa:init=faithful,m=256') == ('ssa', {'init': 'faithful', 'm': 256.0})\n"
        "try:\n"
        "    parse_spec('ssa:int=faithful')\n"
        "except ValueError as err:\n"
        "    print(err)\n"
        "print(len(scorer_table()), sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "scorer 'ssa' has no option 'int'; valid keys: init, preset, m, b, n, learn, share",
        f"{len(DECLARATIONS)} []",
    ]


def test_a_scorer_from_outside_the_table_declares_itself_by_its_class_attributes(monkeypatch):
    table, classes = dict(DECLARATIONS), dict(SCORERS)
    for module in (specs, registration):  # the modules whose functions read these names
        monkeypatch.setattr(module, "DECLARATIONS", table)
    monkeypatch.setattr(registration, "SCORERS", classes)

    class Halved(Scorer):
        name = "halved"
        summary = "softmax(x / 2)"
        traits = Traits("yes", "yes", "one-hot", "no")

        def score(self, x, visible, inputs):
            return SCORERS["softmax"]().score(x / 2, visible, inputs)

    registry.register_scorer(Halved)
    assert list(classes)[-1] == "halved" and list(classes)[:-1] == list(SCORERS)
    assert table["halved"].summary == "softmax(x / 2)" and specs.parse_spec("halved") == ("halved", {})
    with pytest.raises(ValueError, match="already registered"):
        registry.register_scorer(Halved)
