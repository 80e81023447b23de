"""Defaults that the API, the CLI and config templates share: one owner, and cheap to import (no
torch), so the CLI can show them in --help without loading the model stack."""

DEFAULT_MODEL = "builtin:every-softmax"  # what `ssacli diagnose` (and friends) run on without MODEL
DEVICE = "auto"  # where a model loads: CUDA when visible, else the CPU
DTYPE = "auto"  # float32 on the CPU (large probes are not rounded away), the checkpoint's own on a GPU

# diagnose / check
SAMPLES = 8  # inputs per probe level
SEED = 0  # of probe inputs, targets and numbers
BATCH_SIZE = 8  # sequences per forward pass
PROBE_LENGTH = 64  # base length in tokens
ICL_POINTS = 41  # ICL prompts, in (x, y) points: the length the ICL models end their curriculum on,
# and evaluate, report and diagnose use (ssacli.models.icl_task owns the other prompt facts)
# evaluate's prompt lengths: the trained one, and twice and four times its context ((41 − 1)·k + 1)
ICL_LENGTHS = (ICL_POINTS, 2 * ICL_POINTS - 1, 4 * ICL_POINTS - 3)
BLOCK_ROWS = 256  # query rows scored at a time: memory O(block × keys)
TAU = 0.9  # a row has collapsed when its largest weight is >= TAU
TOP_K = 5  # k of the top-k mass metric
STATS = "auto"  # how attention weights become metrics: fused statistics where a call allows them
SINK_EPS = 0.3  # a head is an attention sink when its mean weight on the first token exceeds this (Gu et al.)

# convert: the fidelity target of ssa:init=faithful,m=auto (--max-error; docs/convert.md)
MAX_KL_PER_TOKEN = 1e-3  # nats per token (language models, ICL sign models: per prediction)
MAX_RELATIVE_ERROR = 1e-2  # ‖after − before‖ / ‖before‖ of the output (encoders without an LM head)
CALIBRATION_SAMPLES = 8  # sequences of the calibration text that m=auto and fidelity are measured on
CALIBRATION_LENGTH = 64  # tokens per sequence

# training: the learning rate of scorer parameters (their own AdamW group, no weight decay), in
# every loop (finetune, train, icl train). Adam moves a parameter by ~lr per step, so this sets how
# far SSA's n can travel: ~0.55 × steps × lr over a cosine run (ssacli/models/optim.py; the choice
# is measured in docs/convert.md).
SCORER_LR = 1e-2

# convert --finetune with an SSA scorer: the conversion recipe (ssacli/train/recipe.py)
RECIPE_TARGET_N = 4.0  # SSA's range ends near here; the paper's n is 1.5
RECIPE_MAX_KL = 0.05  # nats/token: the KL budget the result must meet (~ at most 5 % perplexity)
RECIPE_TRANSFER_STEPS = 200
RECIPE_DISTILL_STEPS = 400
RECIPE_LORA_RANK = 8
RECIPE_LR = 5e-4  # LoRA's learning rate (the adapters start at zero)
