#!/usr/bin/env bash
# The prepared GPU run of issue 22, item 6: ICL at the paper's size (12 x 8 x 256; every, linear;
# softmax vs SSA in the authors' GPT-2 setting; >= 3 paired seeds) and an LM pair sized to the data,
# in about 8 minutes on one GPU. Writes OUT/results.json and OUT/tables.md (see studies/gpu-study/run.py).
#
#   studies/gpu-study/run.sh OUT --data TRAIN.txt --id-text ID.txt --ood-text OOD.txt [--blimp DIR]
#   GPU_STUDY_TINY=1 studies/gpu-study/run.sh OUT --data ... --id-text ... --ood-text ...   # CPU, < 1 min
#
# On this project's data: --data ../shared/data/wikitext2/valid.txt
#   --id-text ../shared/data/wikitext2/test.txt --ood-text ../shared/data/tinyshakespeare.txt
#   --blimp ../shared/data/blimp
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
if [[ "${GPU_STUDY_TINY:-0}" != "1" ]] && ! "$python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "studies/gpu-study/run.sh: no CUDA device; run with GPU_STUDY_TINY=1 (or --tiny) for the CPU check, or --device cpu" >&2
    [[ " $* " == *" --device cpu "* || " $* " == *" --tiny "* ]] || exit 3
fi
exec "$python" "$here/run.py" "$@"
