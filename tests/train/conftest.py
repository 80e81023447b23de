"""Fixtures of the training tests: a small text of common English words (the recipe's data)."""

from __future__ import annotations

import random

import pytest

WORDS = "the of and in a to was is for on as by with his at from that it an are were which this".split()


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(14)) + " ." for _ in range(900)]
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("\n".join(lines))
    return str(path)
