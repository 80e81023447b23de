"""The test suite, a package so that tests/<folder>/test_x.py may share a basename with another folder's.

Folders mirror ssacli's packages (tests/diagnosis tests ssacli/diagnosis, ...); tests/contracts holds
the promises that span them (public API, bad input, fast refusals, the all-family audit, the user's
files, 80 columns, benchmarks, the slow real checkpoint); tests/studies runs studies/; tests/helpers
holds what tests import (``from tests.helpers.models import build_model``); fixtures are in conftest.py.
"""
