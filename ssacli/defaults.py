"""Defaults that the API, the CLI and config templates share: one owner, and cheap to import (no
torch), so the CLI can show them in --help without loading the model stack."""

DEFAULT_MODEL = "builtin:every-softmax"  # what `ssacli diagnose` (and friends) run on without MODEL
DEVICE = "auto"  # where a model loads: CUDA when visible, else the CPU
DTYPE = "auto"  # float32 on the CPU (large probes are not rounded away), the checkpoint's own on a GPU

# diagnose / check
SAMPLES = 8  # inputs per probe level
SEED = 0  # every seed's: probe inputs, targets and numbers, training weights and batches, ICL prompts
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

# attribute (ssacli.attribute, `ssacli attribute`; docs/diagnose.md "Attribution by …")
ATTRIBUTE_PROBE = "key-scale:1,8"  # the probe whose damage is attributed, its unshifted level first
ATTRIBUTE_SAMPLES = 16  # prompts: two halves of 8, one to choose heads on, one to measure them
ATTRIBUTE_K = 4  # heads per chosen set
ATTRIBUTE_NULL = 200  # random layer-matched sets per measured set
RESAMPLES = 10_000  # bootstrap resamples of an interval (ssacli.stats; attribute's --resamples)
HEATMAP = "max_weight"  # the metric diagnose's and render's heatmap shows
FINDINGS = 8  # findings the terminal report lists (--findings); the rest are counted, JSON and HTML hold all
SINK_EPS = 0.3  # a first-token head: mean weight on the first token above this (Gu et al.'s sink ε)
# diagnose's sink and position metrics (docs/diagnose.md, "Sinks and positions"; ssacli.kernels.positions)
SINK_K = 4  # the first k keys whose share is the sink share (StreamingLLM keeps 4 initial tokens)
POSITION_BINS = 64  # key bins after the first k: a run's are ceil((length - k) / 64) tokens wide
LOCAL_DISTANCE = 8  # local_share: the mass on keys at distance < 8 (distance bins 0, 1, 2-3, 4-7)
SECONDARY_SINKS = 3  # the key bins past the first k receiving most mass above uniform, per head
# head classes, first that applies (per head, at the unshifted level): sink, local, focused, distributed
CLASS_SINK_SHARE = 0.5  # sink: at least half of each row's mass on the first k keys, on average
CLASS_LOCAL_SHARE = 0.5  # local/recency: at least half within LOCAL_DISTANCE tokens
CLASS_FOCUSED_ENTROPY = 0.5  # focused (retrieval-like): normalized entropy at most this, on other keys

# report: BEFORE vs AFTER (ssacli.quality)
LM_SEQ_LEN = 128  # tokens per LM-loss window (capped at the model's positions), and per training window
LM_MAX_TOKENS = 16384  # LM loss reads at most this many tokens of a text
PAIRS_LIMIT = 200  # minimal pairs per file: its first N
ICL_SIGMAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # σ of the ICL inputs measured (report, icl eval)
ICL_OUTLIERS = ((10.0, 3), (100.0, 3), (1000.0, 3))  # planted outliers (value, position)
# the same two as the options (report, icl eval) take and show them: comma-separated
ICL_SIGMAS_TEXT = ",".join(f"{s:g}" for s in ICL_SIGMAS)
ICL_OUTLIERS_TEXT = ",".join(f"{value:g}@{position}" for value, position in ICL_OUTLIERS)
ICL_PROMPTS = 500  # ICL prompts per evaluated cell (report, icl eval, icl sweep)
ICL_COEF_SIGMA = 1.0  # the linear task: σ of its coefficients a, b

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
SCORER = "softmax"  # the scorer a model is trained with unless told (train, icl train)
ATTENTION = "auto"  # attention kernels while training: fused where no weights are needed

# finetune, convert --finetune: FinetuneConfig's (ssacli/train/finetune_config.py); train uses its loop
FINETUNE_STEPS = 1000
FINETUNE_LR = 1e-4  # peak AdamW learning rate
MIN_LR_RATIO = 0.1  # the cosine schedule ends at this share of the peak learning rate
SCHEDULE = "cosine"  # after warmup: cosine (to MIN_LR_RATIO of the peak) or constant
TRAIN_BATCH_SIZE = 8  # sequences per micro-batch (ICL data: prompts)
GRAD_ACCUM = 1  # micro-batches per optimizer step
WARMUP_DIVISOR = 20  # warmup when not given: steps // WARMUP_DIVISOR (5 %), at most WARMUP_MAX
WARMUP_MAX = 100
WEIGHT_DECAY = 0.0  # AdamW's, on matrices only
TRAIN_WHAT = "all"  # the parameters trained: all, or only the scorer's
CHECKPOINT_EVERY = 500  # steps between checkpoints
LOG_EVERY = 10  # steps between recorded losses

# train: a language model from scratch (what `ssacli train` passes to that loop)
SCRATCH_SIZE = "tiny"  # the model size (ssacli/train/scratch.py)
SCRATCH_LR = 1e-3  # higher than fine-tuning's: the weights start random
SCRATCH_BATCH_SIZE = 16
SCRATCH_WEIGHT_DECAY = 0.1

# icl train and icl sweep: an ICL model from scratch (ssacli.icl.train.TrainConfig, icl.sweep.SweepPlan)
ICL_STEPS = 4000
ICL_SWEEP_STEPS = 3000  # per run of a sweep
ICL_LR = 1e-4  # Adam's
ICL_BATCH_SIZE = 64  # prompts per step
ICL_PRESET = "cpu"  # model size (ssacli.models.icl's presets)
ICL_ARCH = "gpt2"  # backbone: pre-LayerNorm blocks with MLP
ICL_POINTS_START = 11  # curriculum: points per prompt at the start (it ends at ICL_POINTS)
ICL_CHECKPOINT_EVERY = 1000
ICL_SWEEP_TASKS = ("every", "linear")
ICL_SWEEP_SCORERS = ("softmax", "ssa")
ICL_SWEEP_SEEDS = 3  # seeds per scorer
ICL_SWEEP_DEVICE = "cpu"  # where every run of a sweep trains and is evaluated
SWEEP_JOBS = 1  # runs in parallel

# convert --finetune with an SSA scorer: the conversion recipe (ssacli/train/recipe.py)
RECIPE_TARGET_N = 4.0  # SSA's range ends near here; the paper's n is 1.5
RECIPE_MAX_LOSS = 0.05  # nats/token the held-out loss may end above the original's (~ 5 % perplexity)
HELDOUT_TOKENS = 16384  # held-out tokens a conversion is measured on (all of the slice when fewer)
# The recipe's stages when --transfer-steps is not given: distillation alone, n set to the target at
# once. docs/results/convert-tradeoff.md: with and without the transfer stage n = 4 ended at the same
# held-out perplexity (ratio 1.000 [1.000, 1.000], 8 paired seeds) and without it the output KL under
# key-scale 8 was lower (-40 % vs -31 % against the control); its rule, fixed before the runs, deletes
# a stage that does not beat its absence. It stays available: --transfer-steps N (or --stages
# transfer,distill) runs it first.
RECIPE_STAGES = ("distill",)
RECIPE_TRANSFER_STEPS = 200  # when the transfer stage runs
RECIPE_DISTILL_STEPS = 400
RECIPE_LORA_RANK = 8
RECIPE_LR = 5e-4  # LoRA's learning rate (the adapters start at zero)
RECIPE_B = "learned"  # SSA's b: learned (rescaled with n, then trained) or tied (b = 1/n)
# distillation loss = KL + this · the text's cross-entropy. 1, not 0: KL to the original alone gives a
# softmax control no gradient, and was worse than KL + 1 × LM on all three measures of
# docs/results/convert-tradeoff.md, while 4 × LM was better on none of them (the figures are there)
RECIPE_LM_WEIGHT = 1.0
RECIPE_CHECKPOINT_EVERY = 50  # recipe steps between checkpoints (each writes the model whole)
