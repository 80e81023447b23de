"""Fine-tuning: data and held-out slice, objectives, resume == uninterrupted, SIGINT, NaN, --train
scorer, --anneal-n, refusals, 2-process DDP, and `ssacli convert [--finetune]` end to end.

Every model and tokenizer is built here (a word-level tokenizer over a generated corpus, a 2-layer
GPT-2, a 2-layer BERT) or is the bundled ICL checkpoint; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.conversion import convert
from ssacli.errors import InputError, InterruptedJobError, JobFailedError, UsageError
from ssacli.models.checkpoint import training_record
from ssacli.models.icl_task import sample_batch
from ssacli.models.loading import load_model
from ssacli.train.data import ICL_POINTS, TextData, mask_tokens, read_documents, split_heldout
from ssacli.train.finetune import FinetuneConfig, finetune
from ssacli.train.runtime import StopSignals
from tests.helpers.naive import float32_kl_resolution

WORDS = {
    "det": ["the", "a", "every", "some"],
    "adj": ["red", "small", "old", "quiet", "bright"],
    "noun": ["cat", "dog", "bird", "child", "teacher", "river"],
    "verb": ["sees", "likes", "follows", "finds", "hears"],
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is faster, and immune to a busy second core. Module
    scope, so that the module-scoped reference run uses the same thread count as the runs compared
    with it (CPU reductions, hence bit-exact results, depend on the number of threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_corpus(sentences: int = 1500, seed: int = 0) -> str:
    """Sentences of a tiny grammar: learnable structure, so training has something to find."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        pick = {k: rng.choice(v) for k, v in WORDS.items()}
        obj = rng.choice(WORDS["noun"])
        lines.append(f"{pick['det']} {pick['adj']} {pick['noun']} {pick['verb']} the {obj} .")
    return "\n".join(" ".join(lines[i : i + 5]) for i in range(0, len(lines), 5))


def make_tokenizer(text: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([text], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[MASK]"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]"
    )


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A corpus file and folders of a tiny GPT-2 (dropout on) and a tiny BERT, with the tokenizer."""
    root = tmp_path_factory.mktemp("lm")
    text = make_corpus()
    (root / "corpus.txt").write_text(text)
    tokenizer = make_tokenizer(text)
    size = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **size))
    bert = BertForMaskedLM(
        BertConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, **size)
    )
    for name, model in (("gpt2", gpt2), ("bert", bert)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return {"root": root, "data": str(root / "corpus.txt"), "gpt2": str(root / "gpt2"), "text": text,
            "bert": str(root / "bert"), "tokenizer": tokenizer}  # fmt: skip


def lm_config(data: str, **overrides) -> FinetuneConfig:
    values = dict(data=data, steps=6, lr=3e-3, batch_size=4, seq_len=16, warmup=1, checkpoint_every=2)
    return FinetuneConfig(**{**values, **overrides})


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ---- data ---------------------------------------------------------------------------------------------


def test_heldout_is_the_last_tenth_of_the_characters_cut_at_whitespace(tmp_path, lm):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second document " * 20)
    (folder / "sub" / "a.jsonl").write_text(json.dumps({"text": "third one " * 30}) + "\n\n")
    (folder / "a.txt").write_text("first document " * 20)
    (folder / "skip.md").write_text("not read")
    documents = read_documents(folder)
    assert documents == ["first document " * 20, "second document " * 20, "third one " * 30]  # sorted paths
    joined = "\n\n".join(documents)
    train, held = split_heldout(joined)
    assert train + held == joined
    assert held[0].isspace() and not train[-1].isspace()  # cut at a word boundary
    assert 0.09 * len(joined) < len(held) <= 0.1 * len(joined)
    data = TextData.load(folder, lm["tokenizer"])
    assert data.heldout_text == held
    expected = lm["tokenizer"](train, add_special_tokens=False)["input_ids"]
    assert data.train_stream.tolist() == expected


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, "does not exist"),
        ("empty.txt", b"  \n", "holds no text"),
        ("latin1.txt", "café".encode("latin-1"), "not UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": oops}\n', "bad.jsonl:2: not valid JSON"),
        ("field.jsonl", b'{"text": "ok"}\n\n{"body": "x"}\n', 'field.jsonl:3: expected an object with a str'),
    ],
)  # fmt: skip
def test_bad_data_is_a_one_line_input_error(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=message) as err:
        read_documents(path)
    assert "\n" not in str(err.value) and err.value.exit_code == 4


def test_masking_follows_bert_proportions_and_skips_special_tokens():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 50, (64, 512), generator=torch.Generator().manual_seed(1))
    ids[:, ::7] = 0  # a "special" token that must never be selected
    inputs, labels = mask_tokens(ids, mask_id=2, vocab_size=50, generator=generator, special=[0])
    selected = labels != -100
    assert torch.equal(labels[selected], ids[selected]) and not selected[ids == 0].any()
    assert abs(selected.float().mean().item() / (ids != 0).float().mean().item() - 0.15) < 0.01
    masked = (inputs == 2) & selected
    kept = (inputs == ids) & selected
    assert abs(masked.sum() / selected.sum() - 0.8) < 0.02
    assert abs(kept.sum() / selected.sum() - 0.1) < 0.02  # plus the ~1/47 random draws that hit the same id
    assert torch.equal(inputs[~selected], ids[~selected])


# ---- objectives lower the loss ------------------------------------------------------------------------


def reference_causal_loss(model, tokenizer, text: str, seq_len: int = 16) -> float:
    """Next-token cross-entropy on ``text`` computed here, independently of ssacli.train.data."""
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    windows = ids[: len(ids) // seq_len * seq_len].reshape(-1, seq_len)[:16]
    with torch.no_grad():
        logits = model.eval()(input_ids=windows).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)).item()


def test_causal_finetune_lowers_the_heldout_loss(tmp_path, lm):
    loaded = load_model(lm["gpt2"])
    held = split_heldout(lm["text"])[1]
    before = reference_causal_loss(loaded.model, lm["tokenizer"], held)
    config = lm_config(lm["data"], steps=30, batch_size=8, checkpoint_every=30)
    result = finetune(loaded, config, tmp_path / "out")
    after = reference_causal_loss(result.model, lm["tokenizer"], held)
    assert after < 0.75 * before
    record = training_record(tmp_path / "out")
    assert record["step"] == 30 and record["heldout"][-1][1] < record["heldout"][0][1]
    assert record["tokens"] == 30 * 8 * 16 and record["tokens_per_s"] > 0


def test_masked_finetune_lowers_the_masked_loss(tmp_path, lm):
    loaded = load_model(lm["bert"])
    assert loaded.kind == "masked"
    config = lm_config(lm["data"], steps=25, lr=1e-2, batch_size=8, seq_len=32, checkpoint_every=25)
    finetune(loaded, config, tmp_path / "out")
    heldout = training_record(tmp_path / "out")["heldout"]  # the same masked held-out windows each time
    # From ~ln(vocab) to about the unigram entropy: slow for a 2-layer BERT, but a clear drop.
    assert heldout[0][0] == 0 and heldout[-1][0] == 25 and heldout[-1][1] < heldout[0][1] - 0.15


def reference_icl_loss(model, prompts: int = 256) -> float:
    batch = sample_batch("every", prompts, ICL_POINTS, generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        predictions = model.eval()(batch.tokens)
    return F.binary_cross_entropy_with_logits(predictions, (batch.ys > 0).float()).item()


def test_icl_finetune_lowers_the_loss_of_the_bundled_model(tmp_path):
    loaded, _ = convert("builtin:every-softmax", "ssa:n=1,b=0.2")  # a swap that costs accuracy
    before = reference_icl_loss(loaded.model)
    config = FinetuneConfig(data="icl:every", steps=20, lr=1e-3, batch_size=16, checkpoint_every=20)
    result = finetune(loaded, config, tmp_path / "out")
    assert reference_icl_loss(result.model) < 0.5 * before
    reloaded = load_model(str(tmp_path / "out"))
    assert reloaded.kind == "icl" and reloaded.model.spec.training["training"]["step"] == 20


def test_icl_data_must_match_the_model_task(tmp_path):
    with pytest.raises(UsageError, match="does not match the model's task 'every'"):
        finetune("builtin:every-softmax", FinetuneConfig(data="icl:linear", steps=1), tmp_path / "o")
    with pytest.raises(UsageError, match="icl:every"):
        finetune("builtin:every-softmax", FinetuneConfig(data="corpus.txt", steps=1), tmp_path / "o")
    assert not (tmp_path / "o").exists()


# ---- resuming -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(lm, tmp_path_factory):
    """The reference: 6 steps in one go (GPT-2 with dropout, so the dropout RNG must replay too)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    result = finetune(load_model(lm["gpt2"]), lm_config(lm["data"]), out)
    return state(result.model), training_record(out)


def test_resume_after_a_crash_equals_the_uninterrupted_run(tmp_path, lm, uninterrupted):
    def crash(step, loss, lr, tokens_per_s):
        if step == 5:
            raise RuntimeError("power cut")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="power cut"):
        finetune(load_model(lm["gpt2"]), lm_config(lm["data"]), out, on_step=crash)
    assert training_record(out)["step"] == 4  # the last periodic checkpoint
    result = finetune(load_model(lm["gpt2"]), lm_config(lm["data"]), out, resume=True)
    weights, record = uninterrupted
    assert_same_state(state(result.model), weights)
    resumed = training_record(out)
    for key in ("history", "heldout", "step", "tokens"):
        assert resumed[key] == record[key], key


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_the_step_and_resuming_finishes_like_the_uninterrupted_run(
    tmp_path, lm, uninterrupted, sig
):
    def interrupt(step, loss, lr, tokens_per_s):
        if step == 3:
            os.kill(os.getpid(), sig)

    out = tmp_path / "out"
    previous = signal.getsignal(sig)
    config = lm_config(lm["data"], checkpoint_every=100)  # only the interruption writes
    with pytest.raises(InterruptedJobError, match="interrupted at step 3") as err:
        finetune(load_model(lm["gpt2"]), config, out, on_step=interrupt)
    assert err.value.exit_code == 130
    assert signal.getsignal(sig) is previous
    assert training_record(out)["step"] == 3 and int(load_file(out / "trainer.safetensors")["step"]) == 3
    with pytest.raises(UsageError, match="already exists"):  # a restart must say --resume
        finetune(load_model(lm["gpt2"]), config, out)
    result = finetune(str(out), config, out, resume=True)  # the model comes from the checkpoint
    assert_same_state(state(result.model), uninterrupted[0])
    assert training_record(out)["history"] == uninterrupted[1]["history"]


def _handlers_changed(answer) -> None:
    """Put whether StopSignals replaced this process's SIGINT and SIGTERM handlers."""
    signals = (signal.SIGINT, signal.SIGTERM)
    before = [signal.getsignal(s) for s in signals]
    with StopSignals():
        answer.put([signal.getsignal(s) is not b for s, b in zip(signals, before)])


def test_stop_signals_leave_a_multiprocessing_worker_its_default_handling():
    """A pool worker that only noted SIGTERM would never end, and its pool waits for it (a parallel
    study's Ctrl-C hung); the main process still turns a signal into a checkpoint."""
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("fork")  # the test's function needs no import in the child
    answer = ctx.Queue()
    child = ctx.Process(target=_handlers_changed, args=(answer,))
    child.start()
    try:
        assert answer.get(timeout=60) == [False, False]
    finally:
        child.join(timeout=60)
    here: queue.SimpleQueue = queue.SimpleQueue()
    _handlers_changed(here)
    assert here.get() == [True, True]


def test_resume_with_other_settings_is_refused(tmp_path, lm):
    out = tmp_path / "out"
    finetune(load_model(lm["gpt2"]), lm_config(lm["data"], steps=2), out)
    with pytest.raises(UsageError, match="lr 0.003 -> 0.01"):
        finetune(str(out), lm_config(lm["data"], steps=4, lr=1e-2), out, resume=True)


def test_nan_loss_stops_with_exit_5_and_keeps_the_last_good_checkpoint(tmp_path):
    loaded, _ = convert("builtin:every-softmax", "ssa:init=faithful")
    calls = {"n": 0}

    def poison(module, inputs, output):
        if module.training:
            calls["n"] += 1
            if calls["n"] >= 5:  # the 5th training step
                return output * float("nan")
        return output

    loaded.model.read_out.register_forward_hook(poison)
    out = tmp_path / "out"
    config = FinetuneConfig(data="icl:every", steps=8, lr=1e-3, batch_size=4, checkpoint_every=2)
    with pytest.raises(JobFailedError, match="loss became nan at step 5") as err:
        finetune(loaded, config, out)
    assert err.value.exit_code == 5
    assert training_record(out)["step"] == 4
    saved = load_file(out / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in saved.values())


# ---- what is trained ------------------------------------------------------------------------------------


def test_train_scorer_changes_only_the_scorer_parameters(tmp_path, lm):
    loaded, _ = convert(load_model(lm["gpt2"]), "ssa:init=faithful")
    before = state(loaded.model)
    config = lm_config(lm["data"], steps=3, lr=1e-2, train="scorer")
    result = finetune(loaded, config, tmp_path / "out")
    after = state(result.model)
    scorer_keys = {k for k in after if ".ssacli_scorer." in k}
    assert scorer_keys and all(not torch.equal(before[k], after[k]) for k in scorer_keys)
    assert_same_state({k: v for k, v in before.items() if k not in scorer_keys},
                      {k: v for k, v in after.items() if k not in scorer_keys})  # fmt: skip
    assert all(p.requires_grad for p in result.model.parameters())  # flags restored afterwards
    reloaded = state(ssacli.load(str(tmp_path / "out")))
    assert_same_state(reloaded, {k: v for k, v in after.items() if k in reloaded})


def test_train_scorer_without_trainable_scorer_parameters_is_refused(tmp_path, lm):
    with pytest.raises(UsageError, match="nothing to train"):
        finetune(load_model(lm["gpt2"]), lm_config(lm["data"], train="scorer"), tmp_path / "out")


def test_anneal_n_moves_n_linearly_from_m_to_the_target_with_b_one_over_n(tmp_path):
    loaded, _ = convert("builtin:every-softmax", "ssa:init=faithful,m=16,learn=n")
    scorers = list(ssacli.scorers_of(loaded.attention_root).values())
    seen = {}

    def watch(step, loss, lr, tokens_per_s):
        seen[step] = (scorers[0].n.clone(), scorers[0].b.clone())

    config = FinetuneConfig(
        data="icl:every", steps=4, lr=1e-3, batch_size=4, anneal_n=2.0, checkpoint_every=4
    )
    finetune(loaded, config, tmp_path / "out", on_step=watch)
    for step, (n, b) in seen.items():
        expected = 16 + (2 - 16) * step / 4
        torch.testing.assert_close(n, torch.full_like(n, expected), rtol=1e-6, atol=0)
        torch.testing.assert_close(b, 1 / n, rtol=1e-6, atol=0)
    for scorer in ssacli.scorers_of(load_model(str(tmp_path / "out")).attention_root).values():
        torch.testing.assert_close(scorer.n, torch.full_like(scorer.n, 2.0), rtol=1e-6, atol=0)
        torch.testing.assert_close(scorer.b, torch.full_like(scorer.b, 0.5), rtol=1e-6, atol=0)


def test_anneal_n_needs_an_ssa_scorer(tmp_path):
    with pytest.raises(UsageError, match="SSA scorers only; this model's scorer is softmax"):
        finetune(
            "builtin:every-softmax", FinetuneConfig(data="icl:every", steps=1, anneal_n=2.0), tmp_path / "o"
        )


def test_existing_out_is_refused_without_overwrite_or_resume(tmp_path, lm):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    config = lm_config(lm["data"], steps=1)
    with pytest.raises(UsageError, match="already exists"):
        finetune(load_model(lm["gpt2"]), config, out)
    with pytest.raises(UsageError, match="holds no fine-tuning run to resume"):
        finetune(load_model(lm["gpt2"]), config, out, resume=True)
    with pytest.raises(UsageError, match=r"holds files ssacli did not write \(keep.txt\)"):
        finetune(load_model(lm["gpt2"]), config, out, overwrite=True)  # not a folder ssacli wrote
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()  # an empty folder is used
    finetune(load_model(lm["gpt2"]), config, out, overwrite=True)
    assert training_record(out)["step"] == 1
    finetune(load_model(lm["gpt2"]), lm_config(lm["data"], steps=2), out, overwrite=True)  # ssacli's own
    assert training_record(out)["step"] == 2


# ---- two processes ------------------------------------------------------------------------------------


def _ddp_worker(rank: int, world: int, port: int, folder: str, data: str, out: str, probe: str) -> None:
    import ssacli.train.finetune as train_module

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    save = train_module.save_model

    def recording_save(*args, **kwargs):
        with open(os.path.join(probe, f"saved-by-rank{rank}"), "a") as file:
            file.write("x")
        return save(*args, **kwargs)

    train_module.save_model = recording_save
    config = lm_config(data, steps=3, batch_size=2, checkpoint_every=2)
    result = finetune(load_model(folder, device="cpu"), config, out)
    torch.save(state(result.model), os.path.join(probe, f"state{rank}.pt"))


def test_two_process_ddp_keeps_ranks_identical_and_only_rank0_writes(tmp_path, lm):
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out, probe = tmp_path / "out", tmp_path / "probe"
    probe.mkdir()
    mp.spawn(_ddp_worker, args=(2, port, lm["gpt2"], lm["data"], str(out), str(probe)), nprocs=2)
    rank0, rank1 = (torch.load(probe / f"state{r}.pt") for r in (0, 1))
    assert_same_state(rank0, rank1)
    start = state(load_model(lm["gpt2"]).model)
    assert any(not torch.equal(start[k], rank0[k]) for k in start)  # it did train
    assert sorted(p.name for p in probe.iterdir() if p.name.startswith("saved")) == ["saved-by-rank0"]
    assert (probe / "saved-by-rank0").read_text() == "xxx"  # step 0, step 2 and the end
    saved = state(load_model(str(out)).model)
    assert_same_state(saved, {k: v for k, v in rank0.items() if k in saved})
    record = training_record(out)
    assert record["world_size"] == 2 and record["tokens"] == 3 * 2 * 16 * 2


# ---- the command line ---------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_convert_prints_fidelity_and_writes_a_folder_that_reloads_identically(tmp_path):
    out = tmp_path / "every-ssa"
    result = runner.invoke(
        app, ["convert", "builtin:every-softmax", "--scorer", "ssa:init=faithful", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "softmax → ssa:init=faithful" in result.output and "KL" in result.output
    assert "top-1 agreement 100.00%" in result.output
    reference, report = convert("builtin:every-softmax", "ssa:init=faithful")
    assert f"KL {report['kl_per_token']:.3g} nats per prediction" in result.output
    tokens = sample_batch("every", 8, 30, generator=torch.Generator().manual_seed(5)).tokens
    with torch.no_grad():
        assert torch.equal(ssacli.load(str(out))(tokens), reference.model(tokens))
    # --in-place trains the folder itself (it holds no run yet, so one starts).
    result = runner.invoke(
        app, ["finetune", str(out), "--data", "icl:every", "--steps", "3", "--batch-size", "4", "--in-place"]
    )
    assert result.exit_code == 0, result.output
    assert training_record(out)["step"] == 3
    assert json.loads((out / "ssacli.json").read_text())["training"]["fidelity"] == report  # kept
    result = runner.invoke(app, ["finetune", "builtin:every-ssa", "--data", "icl:every"])
    assert isinstance(result.exception, UsageError) and "give --out" in str(result.exception)


def test_cli_convert_finetune_end_to_end_then_finetune_extends_the_run(tmp_path):
    out = tmp_path / "every-ssa-ft"
    args = ["convert", "builtin:every-softmax", "--scorer", "ssa:init=faithful", "--finetune",
            "--data", "icl:every", "--steps", "20", "--batch-size", "8", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "fidelity" in result.output and f"wrote {out} (step 20" in result.output
    meta = json.loads((out / "ssacli.json").read_text())
    assert meta["scorer"] == "ssa:init=faithful" and meta["training"]["fidelity"]["top1_agreement"] == 1.0
    assert meta["training"]["training"]["config"]["batch_size"] == 8
    result = runner.invoke(app, ["finetune", str(out), "--steps", "24", "--resume"])  # settings recorded
    assert result.exit_code == 0, result.output
    assert training_record(out)["step"] == 24 and training_record(out)["config"]["batch_size"] == 8


def test_cli_convert_refuses_finetune_options_without_finetune(tmp_path):
    result = runner.invoke(app, ["convert", "builtin:every-softmax", "--scorer", "ssa", "--out",
                                 str(tmp_path / "o"), "--steps", "5"])  # fmt: skip
    assert isinstance(result.exception, UsageError) and "--steps only applies with --finetune" in str(
        result.exception
    )
    assert not (tmp_path / "o").exists()


# ---- attention backends ------------------------------------------------------------------------------


def count_fused_calls(monkeypatch) -> list[int]:
    """Count SSA's fused-kernel calls (the fused path must really run under the default backend)."""
    from ssacli.scorers.softmax_family import SSA

    calls = [0]
    original = SSA.fused

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SSA, "fused", counting)
    return calls


def test_finetune_on_the_fused_path_matches_the_eager_scorer(tmp_path, monkeypatch):
    """Same start, seeds and steps: the default (fused) run and --attention eager end with the same
    weights and losses to fp32 rounding; only the default run calls the fused kernel."""
    calls = count_fused_calls(monkeypatch)
    runs = {}
    for backend in ("eager", "auto"):
        before = calls[0]
        config = FinetuneConfig(data="icl:every", steps=4, batch_size=8, lr=1e-3, warmup=0, attention=backend)
        result = finetune("builtin:every-ssa", config, tmp_path / backend)
        runs[backend] = (
            state(result.model),
            training_record(tmp_path / backend)["history"],
            calls[0] - before,
        )
    (eager, eager_history, eager_calls), (fused, fused_history, fused_calls) = runs["eager"], runs["auto"]
    assert eager_calls == 0 and fused_calls > 0
    for key in eager:
        torch.testing.assert_close(fused[key], eager[key], rtol=1e-4, atol=1e-5, msg=key)
    for (step_e, loss_e, _), (step_f, loss_f, _) in zip(eager_history, fused_history, strict=True):
        assert step_e == step_f and loss_f == pytest.approx(loss_e, rel=1e-4, abs=1e-7)


def test_icl_training_on_the_fused_path_matches_the_eager_scorer(tmp_path, monkeypatch):
    from ssacli.icl.train import TrainConfig, train

    calls = count_fused_calls(monkeypatch)
    models = {}
    for backend in ("eager", "auto"):
        config = TrainConfig(task="every", scorer="ssa", steps=3, batch_size=8, lr=1e-3, attention=backend)
        models[backend] = state(train(config, tmp_path / backend, device="cpu"))
        assert (calls[0] > 0) == (backend == "auto")
    for key in models["eager"]:
        torch.testing.assert_close(models["auto"][key], models["eager"][key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.badinput
@pytest.mark.parametrize(
    "args",
    [
        ["icl", "train", "--task", "every", "--steps", "1", "--attention", "bogus"],
        [
            "convert",
            "builtin:every-softmax",
            "--scorer",
            "ssa",
            "--finetune",
            "--data",
            "icl:every",
            "--steps",
            "1",
            "--attention",
            "bogus",
        ],
    ],  # fmt: skip
)
def test_an_unknown_attention_backend_is_a_one_line_usage_error(args, tmp_path, monkeypatch, capsys):
    from tests.helpers.cli import run_main

    code, out, err = run_main([*args, "--out", str(tmp_path / "out")], monkeypatch, capsys)
    assert code == 2 and "--attention" in err and "bogus" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ---- the converted → fine-tuned trajectory ---------------------------------------------------------


def test_trajectory_logs_fidelity_n_b_and_loss_at_every_evaluation(tmp_path, lm):
    from transformers import AutoModelForCausalLM

    from ssacli.train.data import make_objective
    from ssacli.train.trajectory import FIDELITY_WINDOWS, read_trajectory

    conv, out = tmp_path / "conv", tmp_path / "ft"
    convert(lm["gpt2"], "ssa:init=faithful,m=64,learn=n", conv)  # records the source
    config = lm_config(lm["data"], steps=4, anneal_n=2.0, log_every=1)
    finetune(str(conv), config, out)
    records = read_trajectory(out)
    record = training_record(out)
    assert [r["step"] for r in records] == [0, 2, 4] and record["trajectory"] == records
    history = {step: loss for step, loss, _ in record["history"]}
    assert records[0]["loss"] is None and [r["loss"] for r in records[1:]] == [history[2], history[4]]
    assert [[r["step"], r["heldout_loss"]] for r in records] == record["heldout"]
    for r in records:  # n annealed linearly from 64 to 2, b = 1/n, one value per layer
        n = 64 + (2 - 64) * r["step"] / 4
        assert r["scorer"]["n"] == pytest.approx([n, n], rel=1e-5)
        assert r["scorer"]["b"] == pytest.approx([1 / n, 1 / n], rel=1e-5)
    # the fidelity at step 0, independently: the source's own eager path against the converted model
    loaded = load_model(str(conv))
    ids = make_objective(loaded, lm["data"], "auto", 16).heldout()[0]["input_ids"][:FIDELITY_WINDOWS]
    source = AutoModelForCausalLM.from_pretrained(lm["gpt2"], attn_implementation="eager").eval()
    with torch.no_grad():
        log_p = F.log_softmax(source(ids).logits.double(), -1)
        log_q = F.log_softmax(loaded.model(input_ids=ids).logits.double(), -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    # Both KLs are float32 forward noise here (the faithful start is exact): they agree within the
    # float32 resolution of the log-probabilities, not to an absolute 1e-9.
    assert records[0]["kl_to_source"] == pytest.approx(kl, rel=1e-3, abs=float32_kl_resolution(log_p))
    # n = 2 is far from softmax: the last KL is well above that resolution and must match the saved
    # model's, computed independently, to a relative tolerance.
    final = load_model(str(out))
    with torch.no_grad():
        log_q = F.log_softmax(final.model(input_ids=ids).logits.double(), -1)
    kl_final = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    assert kl_final > 100 * float32_kl_resolution(log_p)
    assert records[-1]["kl_to_source"] == pytest.approx(kl_final, rel=1e-3)
    # resuming continues the trajectory
    finetune(str(conv), lm_config(lm["data"], steps=6, anneal_n=2.0, log_every=1), out, resume=True)
    again = read_trajectory(out)
    assert [r["step"] for r in again] == [0, 2, 4, 6] and again[:3] == records
