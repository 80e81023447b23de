"""Training: fine-tuning (finetune.py), fresh models (scratch.py), whole runs as the commands start
them (runs.py). Nothing heavy is imported here: the CLI reads :data:`DATA_FORMS` for its help."""

DATA_FORMS = "a .txt file, a .jsonl file (field 'text'), a folder of them, or icl:TASK"  # what data= takes
# The smallest vocabulary of a fresh model's tokenizer (scratch.py): byte-level BPE's 256 bytes and
# the 4 merges of its minimum, plus the 5 special tokens (<pad>, <s>, </s>, <unk>, <mask>).
MIN_VOCAB = 265
