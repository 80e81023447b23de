#!/usr/bin/env bash
# transformers compatibility: run the suite on the oldest and the newest transformers release that
# pyproject.toml accepts (transformers>=5.20,<6), each in a fresh venv of its own, since ssacli
# depends on transformers' attention interface, and run the all-family audit on each
# (scripts/models_table.py --check: its summary, and the rows that differ from docs/models.md). The
# README's test command pins the release the audit table was measured on (AUDITED_ON in
# ssacli/attention/audited.py); on any other release the suite's drift tests (the table, the audited
# set, the eager-fallback list's tripwire) skip with the reason that the table is stale there, and
# everything else must pass. A table that differs on another release is reported, not a failure; on
# AUDITED_ON it fails (the suite's drift tests fail there too).
#
#   scripts/transformers_compat.sh                 # 5.20.0 and the newest 5.x, the whole suite
#   scripts/transformers_compat.sh --quick         # the same releases, the attention-facing subset
#   scripts/transformers_compat.sh --quick 5.23.0  # one release
#   TORCH_SPEC=torch==2.11.0 scripts/transformers_compat.sh --quick newest  # the oldest torch too
#
# Venvs and logs go to $SSACLI_COMPAT_DIR (default: $TMPDIR/ssacli-compat); torch is installed as
# $TORCH_SPEC (default torch==2.13.0) from $TORCH_INDEX (default: PyTorch's CPU wheels; set it
# empty to use pip's own configuration: PyPI, whose Linux torch wheels are CUDA builds of ~4.5 GB
# with their libraries, or a local wheel folder). Exits 1 when any release fails; prints one summary
# line per release (with the torch it ran on) and one for its audit.
#
# 5.20 is the floor: 5.19.0 fails the subset (t5 computes attention outside the AttentionInterface:
# NaN metrics), and 5.20.0 through 5.23 needed only ssacli's decoding to hand the KV cache under the
# name each release reads (past_key_values before 5.24, cache since: attention/arguments.py).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(5.20.0 newest)
dir=${SSACLI_COMPAT_DIR:-${TMPDIR:-/tmp}/ssacli-compat}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
torch_index=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}  # TORCH_INDEX= : pip's own config
# The subset: every test of the attention interface and of what rides on it (diagnose and its KV-cache
# decoding, convert's checkpoints, big-model loading, Hub ids from a cache), without the slower
# training and report tests.
subset=(tests/attention/test_attention.py tests/diagnosis/test_learned_sinks.py
        tests/contracts/test_families.py tests/diagnosis/test_diagnose.py tests/diagnosis/test_generation.py
        tests/models/test_checkpoint.py tests/models/test_device_map.py tests/models/test_hub.py
        tests/scorers/test_scorers.py)
mkdir -p "$dir"
failed=0
summary=()
for version in "${versions[@]}"; do
  spec="transformers==$version"
  [ "$version" = newest ] && spec="transformers>=5.20,<6"
  env="$dir/tf-$version"
  log="$dir/tf-$version.log"
  echo "== $spec: venv $env, log $log"
  if [ $quick = 1 ]; then extras=("$spec" -e "$repo" pytest pytest-xdist hypothesis jsonschema "accelerate>=1.1")
  else extras=("$spec" -e "$repo[dev]"); fi
  # (errexit does not apply inside a `||` list, so the steps are chained with &&)
  if ! { python3 -m venv "$env" && "$env/bin/pip" install -q --upgrade pip \
         && "$env/bin/pip" install -q "$torch_spec" ${torch_index:+--index-url "$torch_index"} \
         && "$env/bin/pip" install -q "${extras[@]}"; } >"$log" 2>&1; then
    summary+=("$spec: install failed (see $log)"); failed=1; continue
  fi
  installed=$("$env/bin/python" -c "import transformers; print(transformers.__version__)")
  torch_version=$("$env/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)
  tests=()
  [ $quick = 1 ] && tests=("${subset[@]}")
  echo "   transformers $installed: pytest ${tests[*]:-(the suite)}"
  if OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$env/bin/python" -m pytest -q -p no:cacheprovider -rs \
      "${tests[@]}" >>"$log" 2>&1; then
    summary+=("transformers $installed, torch $torch_version: passed ($(tail -1 "$log"))")
  else
    summary+=("transformers $installed, torch $torch_version: FAILED ($(tail -1 "$log"); see $log)")
    failed=1
  fi
  audited_on=$("$env/bin/python" -c "from ssacli.attention.audited import AUDITED_ON; print(AUDITED_ON)")
  audit_log="$dir/tf-$version.audit.log"
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$env/bin/python" scripts/models_table.py --check >"$audit_log" 2>&1
  table=$?
  line="  audit on $installed: $(grep -m1 ' families: ' "$audit_log" || echo 'did not run')"
  if [ $table = 0 ]; then
    summary+=("$line; docs/models.md is this release's table")
  elif [ "$installed" = "$audited_on" ]; then
    summary+=("$line; FAILED: docs/models.md differs on the release it was measured on (see $audit_log)")
    failed=1
  else
    summary+=("$line; docs/models.md was measured on $audited_on: $(grep -c '^[-+]|' "$audit_log") table lines differ here (see $audit_log)")
  fi
done
printf '%s\n' "${summary[@]}"
exit $failed
