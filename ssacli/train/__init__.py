"""Training: fine-tuning (finetune.py), fresh models (scratch.py), whole runs as the commands start
them (runs.py). Nothing heavy is imported here: the CLI reads :data:`DATA_FORMS` for its help and
checks --data with :func:`require_data` before the model stack loads."""

from ..errors import UsageError

DATA_FORMS = "a .txt file, a .jsonl file (field 'text'), a folder of them, or icl:TASK"  # what data= takes
# The smallest vocabulary of a fresh model's tokenizer (scratch.py): byte-level BPE's 256 bytes and
# the 4 merges of its minimum, plus the 5 special tokens (<pad>, <s>, </s>, <unk>, <mask>).
MIN_VOCAB = 265


def require_data(data: str | None, hint: str = "") -> None:
    """Refuse a run without training data (``hint``: how else the run could have it)."""
    if data is None:
        raise UsageError(f"--data is required: {DATA_FORMS}{hint}")
