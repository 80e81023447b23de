"""studies/gpu-study/run.sh in its TINY mode, end to end on the CPU: the ICL sweep (every, linear;
softmax and SSA in the authors' GPT-2 setting) and the LM pair on text this test writes. Checks that
results.json holds every arm and seed of both studies with their learned scorer parameters, that
the LM's passes are measured with the run's own tokenizer, and that the tables render."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def words(seed: int, count: int, vocabulary: list[str]) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(vocabulary) for _ in range(count)) + "\n"


def test_tiny_gpu_study_runs_end_to_end(tmp_path):
    common = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "house", "of", "it"]
    (tmp_path / "train.txt").write_text("".join(words(s, 60, common) for s in range(30)))
    (tmp_path / "id.txt").write_text("".join(words(100 + s, 60, common) for s in range(4)))
    (tmp_path / "ood.txt").write_text("".join(words(200 + s, 60, ["thou", "art", "hath"]) for s in range(4)))
    blimp = tmp_path / "blimp"
    blimp.mkdir()
    pair = {"sentence_good": "the cat sat on a mat", "sentence_bad": "cat the mat a on sat"}
    (blimp / "agreement.jsonl").write_text((json.dumps(pair) + "\n") * 3)
    out = tmp_path / "study"
    runner = ROOT / "studies" / "gpu-study" / "run.sh"
    cmd = ["bash", str(runner), str(out), "--data", str(tmp_path / "train.txt"),
           "--id-text", str(tmp_path / "id.txt"), "--ood-text", str(tmp_path / "ood.txt"),
           "--blimp", str(blimp)]  # fmt: skip
    env = {**os.environ, "GPU_STUDY_TINY": "1", "PYTHON": sys.executable}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    design = results["design"]
    assert design["tiny"] and design["device"] == "cpu" and design["seeds"] == 2
    icl_plan = json.loads((out / "icl-plan.json").read_text())
    assert icl_plan["preset"] == "cpu"  # tiny; the GPU run uses "paper" (12 x 8 x 256)

    expected_icl = {(t, a, s) for t in ("every", "linear") for a in ("softmax", "ssa-gpt2") for s in (0, 1)}
    icl_runs = {(r["task"], r["label"], r["seed"]): r for r in results["icl_runs"]}
    assert set(icl_runs) == expected_icl
    for (_, label, _), run in icl_runs.items():
        assert math.isfinite(run["error_in_distribution"]) and run["error_in_distribution"] >= 0
        if label == "softmax":
            assert run["scorer"] == {}
        else:  # b and n of each of the cpu preset's 3 layers (share=layer: one value each)
            assert len(run["scorer"]) == 3
            for values in run["scorer"].values():
                assert len(values["b"]) == len(values["n"]) == 1
                # they started at e and e^0.4 and moved a little in 3 steps
                assert abs(values["b"][0] - math.e) < 0.5 and abs(values["n"][0] - math.exp(0.4)) < 0.5
    assert {(r["label"], r["seed"]) for r in results["lm_runs"]} == {
        (a, s) for a in ("softmax", "ssa-authors") for s in (0, 1)
    }
    ssa = next(r for r in results["lm_runs"] if r["label"] == "ssa-authors")
    assert ssa["scorer"] and all(
        v["b"] == [0.8] or abs(v["b"][0] - 0.8) < 1e-6 for v in ssa["scorer"].values()
    )
    # every paired row of both studies carries the tests beside the interval
    for row in results["icl_paired"] + results["lm_paired"]:
        assert {"ci_low", "ci_high", "permutation_p", "t_test_p"} <= set(row)

    lm = design["lm"]
    assert lm["tokens_per_run"] == 2 * 4 * 16  # steps x batch x seq_len of the tiny plan
    assert lm["passes"] == round(lm["tokens_per_run"] / lm["train_tokens"], 2)

    tables = (out / "tables.md").read_text()
    assert "TINY mode" in tables
    assert "#### every, gpt2: magnitude shift" in tables and "#### linear, gpt2: coefficient shift" in tables
    assert "| ppl id@1x | ssa-authors − softmax |" in tables
    assert "*Family:" in tables  # the multiplicity line under each paired ICL table
    assert f"{lm['passes']:g} passes" in tables
