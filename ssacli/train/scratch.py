"""Fresh models for training from scratch, so softmax and any other scorer start from the same point.

Comparing scorers on a pretrained softmax model always favours softmax (the weights were shaped by
it); training from scratch is the paper's fair comparison. :func:`new_model` builds a randomly
initialized language model with a byte-level BPE tokenizer trained on the user's texts, puts the
scorer in every attention layer, and returns a :class:`~ssacli.models.loading.LoadedModel` that the
fine-tuning loop (``ssacli.train.finetune.finetune``) trains like any loaded model.

Sizes (``SIZE`` is ``tiny``, ``small``, or a ``config.json`` or the folder holding one):

==============  ======  =====  =====  ====  =====  =======  ============================================
arch / size     layers  heads  width  FFN   vocab  seq_len  why
==============  ======  =====  =====  ====  =====  =======  ============================================
any / tiny      2       4      64     256*  1024   128      trains in seconds on a CPU (tests, smoke runs)
gpt2 / small    4       4      256    1024  4096   256      minutes on one GPU, big enough to rank scorers
llama / small   4       4      256    688   4096   256      same budget as gpt2 (SwiGLU FFN of ~8/3 width)
roberta / small 8       8      256    1024  8192   128      BabyBERTa (the paper's MLM experiment)
==============  ======  =====  =====  ====  =====  =======  ============================================

(*) llama/tiny: 176 (SwiGLU). ``vocab`` is an upper bound: BPE stops early when the texts have no
more pairs seen twice, and the model's vocabulary is always exactly the tokenizer's.

Dropout is 0 for the built-in sizes except roberta/small, which keeps BabyBERTa's 0.1: short runs
on little data learn fastest without it, and the paper's ICL backbone has none. Embeddings are tied
(input = output) everywhere, which matters at these sizes (the vocab matrix is most of the model).
A ``config.json`` is used as given, except that its vocabulary and special-token ids are set to the
trained tokenizer's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, UsageError
from ..models.kinds import ModelKind, language_model_kind
from ..models.loading import LoadedModel
from . import MIN_VOCAB, require_text_data
from .settings import ARCHS, SIZES, read_size  # noqa: F401 (SIZES: importable here too)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")  # ids 0..4 in this order
PAD, BOS, EOS, UNK, MASK = SPECIAL_TOKENS


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    width: int
    ffn: int
    vocab: int
    seq_len: int
    dropout: float = 0.0


SHAPES: dict[tuple[str, str], Shape] = {
    ("gpt2", "tiny"): Shape(2, 4, 64, 256, 1024, 128),
    ("llama", "tiny"): Shape(2, 4, 64, 176, 1024, 128),
    ("roberta", "tiny"): Shape(2, 4, 64, 256, 1024, 128),
    ("gpt2", "small"): Shape(4, 4, 256, 1024, 4096, 256),
    ("llama", "small"): Shape(4, 4, 256, 688, 4096, 256),
    ("roberta", "small"): Shape(8, 8, 256, 1024, 8192, 128, dropout=0.1),
}


def new_model(
    arch: str | None,
    size: str,
    scorer: str = "softmax",
    *,
    texts: Iterable[str] | None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
) -> LoadedModel:
    """A randomly initialized LM of ``arch`` × ``size`` scored by ``scorer``, with a BPE tokenizer
    trained on ``texts`` (ssacli's built-in probe texts when None: enough for a smoke test only).

    ``size`` may be the path of a config.json; its ``model_type`` then decides the architecture
    (``arch`` may be None, or must agree). The same arguments give the same weights and vocabulary.
    """
    from ..scorers import make_scorer

    make_scorer(scorer)  # a bad spec fails before the tokenizer is trained
    config_dict, arch, kind = _base_config(arch, size)
    shape = SHAPES.get((arch, size))
    if vocab_size is None:
        vocab_size = shape.vocab if shape else 4096
    if vocab_size < MIN_VOCAB:
        raise UsageError(
            f"vocab size {vocab_size} is too small: byte-level BPE with {len(SPECIAL_TOKENS)} special tokens "
            f"needs at least {MIN_VOCAB} entries; give --vocab-size {MIN_VOCAB} or more"
        )
    if seq_len is None:
        seq_len = shape.seq_len if shape else _config_positions(config_dict, arch) or 256
    if seq_len < 2:
        raise UsageError(f"seq_len must be at least 2, got {seq_len}")
    corpus = list(texts) if texts is not None else None
    if corpus is None:
        from ..diagnosis.texts import TEXTS

        corpus = list(TEXTS)
    if not any(t.strip() for t in corpus):
        raise InputError("no text to train the tokenizer on; give files with some text")
    tokenizer = train_tokenizer(corpus, vocab_size, masked=kind == ModelKind.MASKED, max_length=seq_len)
    config = _config(config_dict, arch, shape, len(tokenizer), seq_len)
    model = _build(config, kind, seed)
    from ..attention.interface import apply_scorer

    apply_scorer(model, scorer)
    label = size if shape else Path(size).name
    return LoadedModel(model, f"new:{arch}-{label}", config.model_type, kind, tokenizer, seq_len, None)


def train_tokenizer(texts: list[str], vocab_size: int, *, masked: bool = False, max_length: int = 512):
    """Byte-level BPE (GPT-2's scheme: every byte is a token, so nothing is ever unknown) trained on
    ``texts``, as a ``PreTrainedTokenizerFast`` with <pad> <s> </s> <unk> <mask> at ids 0-4.

    Masked LMs get RoBERTa's ``<s> … </s>`` (also as CLS/SEP) around each text; causal ones get
    nothing added, as GPT-2's tokenizer (training windows are cut from the packed text, see
    ssacli.train.data). Deterministic for the same inputs, across processes too.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[*SPECIAL_TOKENS[:-1], AddedToken(MASK, lstrip=True, special=True)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if masked:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}",
            pair=f"{BOS} $A {EOS} {EOS} $B {EOS}",
            special_tokens=[(BOS, tok.token_to_id(BOS)), (EOS, tok.token_to_id(EOS))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    roles = {"cls_token": BOS, "sep_token": EOS} if masked else {}  # RoBERTa's CLS … SEP
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        **roles,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        mask_token=MASK,  # lstrip: " <mask>" is one token, as in RoBERTa
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def training_texts(data: str | Path) -> list[str]:
    """The text a tokenizer for ``--data`` is trained on: the training part as ssacli.train.data splits it
    (files and folders read the same way), so the held-out text never shapes the vocabulary.

    Returned in pieces cut before each run of newlines that follows a non-space: the BPE trainer
    works on many short sequences in parallel, and byte-level pre-tokenization (GPT-2's regex)
    never puts a non-space and the next newline in one piece, so the merges are those of the
    whole string.
    """
    from .data import read_documents, split_heldout

    require_text_data(data)
    train, _ = split_heldout("\n\n".join(read_documents(data)))
    return re.split(r"(?<=\S)(?=\n)", train)


# ---- configs --------------------------------------------------------------------------------------


def _base_config(arch: str | None, size: str) -> tuple[dict[str, Any], str, str]:
    """(config dict from a file or {}, arch, kind) after checking the arch and size."""
    config, arch, path = read_size(arch, size)
    if path is None:
        return {}, arch, "masked" if arch == "roberta" else "causal"
    return config, arch, _family_kind(arch, path)


def _family_kind(model_type: str | None, path: Path) -> str:
    kind = language_model_kind(model_type)
    if kind is None:
        raise UsageError(
            f"{path}: model_type '{model_type}' has no causal- or masked-LM head in transformers; "
            f"use one of {', '.join(ARCHS)} or another language-model family"
        )
    return kind


def _config_positions(config: dict[str, Any], arch: str) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value - 2 if arch == "roberta" else value
    return None


def _config(base: dict[str, Any], arch: str, shape: Shape | None, vocab: int, seq_len: int):
    from transformers import AutoConfig

    special = {"vocab_size": vocab, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if shape is None:
        kwargs = {k: v for k, v in base.items() if k not in ("model_type", "transformers_version")}
        config = AutoConfig.for_model(arch, **{**kwargs, **special})
        positions = _config_positions(base, arch)
        if positions is not None and seq_len > positions:
            raise UsageError(f"seq_len {seq_len} is longer than the config's {positions} positions")
        return config
    if arch == "gpt2":
        kwargs = dict(
            n_layer=shape.layers, n_head=shape.heads, n_embd=shape.width, n_inner=shape.ffn,
            n_positions=seq_len, resid_pdrop=shape.dropout, embd_pdrop=shape.dropout,
            attn_pdrop=shape.dropout,
        )  # fmt: skip
    elif arch == "llama":
        kwargs = dict(
            num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
            num_key_value_heads=shape.heads, hidden_size=shape.width, intermediate_size=shape.ffn,
            max_position_embeddings=seq_len, attention_dropout=shape.dropout,
        )  # fmt: skip
    else:  # roberta: positions start after the padding id, hence + 2 (RoBERTa's 514 for 512)
        kwargs = dict(
            num_hidden_layers=shape.layers, num_attention_heads=shape.heads, hidden_size=shape.width,
            intermediate_size=shape.ffn, max_position_embeddings=seq_len + 2, type_vocab_size=1,
            hidden_dropout_prob=shape.dropout, attention_probs_dropout_prob=shape.dropout,
            layer_norm_eps=1e-5,
        )  # fmt: skip
    return AutoConfig.for_model(arch, **kwargs, **special, tie_word_embeddings=True)


def _build(config, kind: str, seed: int):
    """Seeded random init; the global RNG is restored so callers' randomness does not shift."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForMaskedLM if kind == ModelKind.MASKED else AutoModelForCausalLM
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = auto.from_config(config, attn_implementation="eager")
    finally:
        torch.random.set_rng_state(state)
    return model.float().eval()


def parameter_count(model: torch.nn.Module) -> int:
    """Parameters counted once (tied embeddings are one matrix)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def describe(loaded: LoadedModel) -> str:
    """One line for the CLI: what was built."""
    config = loaded.config
    millions = parameter_count(loaded.model) / 1e6
    size = f"{millions:.2f}M" if millions < 10 else f"{math.floor(millions)}M"
    return (
        f"{loaded.name}: {size} parameters, {config.num_hidden_layers} layers × "
        f"{config.num_attention_heads} heads × {config.hidden_size} wide, vocab {config.vocab_size}, "
        f"{loaded.max_positions} positions, scorer {getattr(config, 'ssacli_scorer', 'softmax')}"
    )
