"""The README's Python blocks run as written: each is executed as a script in a fresh interpreter,
offline, on the bundled models (the example once called apply_scorer with a spec that needs
`convert`, and make_scorer on names it never defined)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_blocks():
    assert BLOCKS, "README.md lost its Python example"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_python_block_runs_as_written(index, tmp_path):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # offline: no block may need the network
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
