"""The wheel users install (README's Quick start, docs/ci.md's workflow): built by
`python -m build --wheel` from a copy of the sources, installed into a fresh venv, then run from
there: `ssacli --help` and a diagnose of the bundled default model, whose files (checkpoints, the
result schema, the C kernels' sources) must be in the wheel's package data.

Offline: the build is `--no-isolation` (setuptools as installed, nothing fetched) and the wheel goes in
with `--no-deps --no-index`; the fresh venv reaches torch, transformers and the rest through a path
file naming this interpreter's site-packages, appended after its own, so `import ssacli` finds the
installed wheel and never this checkout (an editable install's finder is not loaded from a path file's
folder). 26-29 s on this project's 2-core machine (16 s building and installing, 10 s running), under
the ~30 s past which a test is marked slow, so it runs with the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel built from this checkout installed; returns its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"  # a copy: the build's build/ and *.egg-info stay out of the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "ssacli", source / "ssacli", ignore=shutil.ignore_patterns("__pycache__"))
    run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(work / "dist"),
            str(source),
        ]
    )
    (wheel,) = (work / "dist").glob("ssacli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("ssacli/py.typed", "ssacli/diagnosis/diagnose.schema.json", "ssacli/kernels/native_ssa.c",
                    "ssacli/checkpoints/every-softmax/model.safetensors"):  # fmt: skip
        assert shipped in names, shipped
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    (Path(site) / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)])
    return venv / "bin"


def test_the_wheel_installs_and_runs_from_a_fresh_venv(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = run(
        [str(installed / "python"), "-c", "import ssacli; print(ssacli.__file__)"], cwd=tmp_path, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout  # not the checkout
    help_page = run([str(installed / "ssacli"), "--help"], cwd=tmp_path, env=env).stdout
    assert "diagnose" in help_page and "check" in help_page
    out = tmp_path / "r.json"
    args = ["diagnose", "--probe", "outlier:1,10", "--samples", "1", "--quiet", "--json", str(out)]
    run([str(installed / "ssacli"), *args], cwd=tmp_path, env=env)
    data = json.loads(out.read_text())
    assert data["model"] == "builtin:every-softmax" and data["weights"]["files"] == 1
