"""Defaults that the API, the CLI and config templates share: one owner, and cheap to import (no
torch), so the CLI can show them in --help without loading the model stack."""

DEFAULT_MODEL = "builtin:every-softmax"  # what `ssacli diagnose` (and friends) run on without MODEL

# diagnose / check
SAMPLES = 8  # inputs per probe level
SEED = 0  # of probe inputs, targets and numbers
BATCH_SIZE = 8  # sequences per forward pass
PROBE_LENGTH = 64  # base length in tokens
ICL_POINTS = 40  # base length of ICL prompts, in (x, y) points
BLOCK_ROWS = 256  # query rows scored at a time: memory O(block × keys)
TAU = 0.9  # a row has collapsed when its largest weight is >= TAU
TOP_K = 5  # k of the top-k mass metric
SINK_EPS = 0.3  # a head is an attention sink when its mean weight on the first token exceeds this (Gu et al.)
