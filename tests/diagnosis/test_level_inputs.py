"""What each probe level's forward is given: the tokenizer's own special prefix (``<bos>``) at the
start of every window, and length levels only as long as the machine's memory holds their logits.

Both checked from the outside: the token ids the model's forward receives (a forward pre-hook), and
the levels the result reports, against the tokenizer's own encoding and the plan's declared bytes.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import ssacli
from ssacli.diagnosis import plan
from ssacli.diagnosis.texts import TEXTS
from ssacli.errors import UsageError


def _tokenizer(bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]"]))
    if bos:  # what Llama's and Gemma's tokenizers do: "<bos> text" unless add_special_tokens=False
        tok.post_processor = processors.TemplateProcessing(
            single="[BOS] $A", special_tokens=[("[BOS]", tok.token_to_id("[BOS]"))]
        )
    special = {"pad_token": "[PAD]", "unk_token": "[UNK]", "bos_token": "[BOS]"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def _model(tokenizer, positions: int = 64) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": None, "eos_token_id": None}
    shape = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": positions}
    config = GPT2Config(vocab_size=len(tokenizer), **shape, **special)
    return GPT2LMHeadModel(config).eval()


def _first_ids(model) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    record = lambda _module, _args, kwargs: seen.append(kwargs["input_ids"])  # noqa: E731
    model.register_forward_pre_hook(record, with_kwargs=True)
    return seen


@pytest.mark.parametrize("bos", [True, False])
def test_every_window_starts_as_the_tokenizer_starts_a_text(bos):
    tokenizer = _tokenizer(bos)
    model = _model(tokenizer)
    seen = _first_ids(model)
    ssacli.diagnose(model, ["embed-scale:1", "numeric:2"], tokenizer=tokenizer, samples=3, length=12)
    expected_start = tokenizer("word")["input_ids"][:-1]  # the prefix the tokenizer adds, or nothing
    assert expected_start == ([tokenizer.bos_token_id] if bos else [])
    assert seen, "the model was never run"
    for ids in seen:
        assert ids.shape[1] >= 2
        starts = ids[:, : len(expected_start)].tolist()
        assert all(row == expected_start for row in starts)
        if not bos:  # without a prefix no window holds the BOS id at all
            assert not (ids == tokenizer.bos_token_id).any()
    # the text windows keep their length: the prefix takes a text token's place
    assert seen[0].shape[1] == 12


def test_shift_documents_start_with_the_prefix_and_keep_their_length():
    tokenizer = _tokenizer(bos=True)
    model = _model(tokenizer)
    seen = _first_ids(model)
    shifted = " ".join(reversed(" ".join(TEXTS).split()))
    ssacli.diagnose(model, ["shift"], tokenizer=tokenizer, shift=shifted, samples=2, length=10)
    assert seen and all(ids.shape[1] == 10 for ids in seen)
    assert all((ids[:, 0] == tokenizer.bos_token_id).all() for ids in seen)
    assert all(not (ids[:, 1:] == tokenizer.bos_token_id).any() for ids in seen)


def _logit_bytes(rows: int, tokens: int, vocab: int) -> int:
    return plan.LOGIT_COPIES * rows * tokens * vocab * 4  # float32 logits and their copies


def test_default_length_levels_stop_where_the_memory_does_and_say_so(monkeypatch):
    tokenizer = _tokenizer(bos=False)
    model = _model(tokenizer, positions=64)
    vocab, length, samples = model.config.vocab_size, 8, 2
    # ×2 (16 tokens, one row: the samples shrink as the length grows) fits exactly; ×4 does not
    free = _logit_bytes(1, 2 * length, vocab)
    monkeypatch.setattr(plan, "free_memory", lambda device: free)
    result = ssacli.diagnose(model, ["length"], tokenizer=tokenizer, samples=samples, length=length)
    probe = result.probe("length")
    assert probe.levels == [1.0, 2.0]
    assert "×4" in probe.note and "32 tokens" in probe.note and "not run" in probe.note


def test_an_asked_level_beyond_the_memory_is_refused_before_any_forward(monkeypatch):
    tokenizer = _tokenizer(bos=False)
    model = _model(tokenizer, positions=64)
    seen = _first_ids(model)
    monkeypatch.setattr(plan, "free_memory", lambda device: _logit_bytes(1, 16, model.config.vocab_size))
    refusal = r"level ×4 \(32 tokens\) needs about .* GiB .*levels up to ×2 \(e.g. --probe length:1,2\)"
    with pytest.raises(UsageError, match=refusal):
        ssacli.diagnose(model, ["length:1,2,4"], tokenizer=tokenizer, samples=2, length=8)
    assert seen == []  # refused at the plan: nothing ran, nothing was lost
