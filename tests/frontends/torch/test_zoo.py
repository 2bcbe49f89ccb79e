"""A zoo of model code nobody here wrote: ``transformers`` models through ``se.from_torch``.

Acceptance (issues 23 and 47): GPT-2, Llama (grouped-query attention, rotary embeddings,
RMSNorm), Mistral (sliding-window attention), BERT, DistilBERT, ViT, ResNet and ConvNeXt
(layer norm over channels-last), built from small configs (never downloaded), train 3
SGD steps on 1 and 2 CPU places exactly as eager PyTorch does (float64, 1e-6: the loss
and every parameter); a padded batch with an ``attention_mask`` gives eager's loss; one
program trains on sequence lengths 16 and 32; tied embeddings stay one parameter with
one all-reduce; the trained model saves with ``save_pretrained`` and reloads equal;
an AdamW run of Llama. The models are fed as users have them (``input_ids``,
``attention_mask``, ``labels`` by keyword) and their own ``loss`` output is the loss.

Skipped without ``transformers`` (``make test`` installs it); marked ``slow`` (each
capture takes seconds), so ``make test-fast`` leaves it out. Each model is captured
once and optimizers are appended to clones of the program.
"""

import os

import pytest
import torch

import ssaexec as se
from ssaexec.frontends.torch import from_torch, write_back
from ssaexec.graph.ssa import AllReduceOpHandle
from ssaexec.program.desc import grad_var_name
from tests.frontends.torch.test_from_torch import _with_optimizer  # clones of a program with an optimizer

T = pytest.importorskip("transformers")
T.logging.set_verbosity_error()
T.utils.logging.disable_progress_bar()

pytestmark = pytest.mark.slow

B, S, V, STEPS, LR = 4, 16, 64, 3, 0.1
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64)


def _config(name):
    """The small config of zoo model ``name`` (dropout off, so runs compare exactly)."""
    if name == "gpt2":
        return T.GPT2Config(vocab_size=V, n_layer=2, n_embd=32, n_head=4, n_positions=64,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
    if name == "llama":  # grouped-query attention: 4 heads share 2 key/value heads
        return T.LlamaConfig(vocab_size=V, num_key_value_heads=2, bos_token_id=0,
                             eos_token_id=0, pad_token_id=0, **DECODER)
    if name == "mistral":
        return T.MistralConfig(vocab_size=V, num_key_value_heads=2, bos_token_id=0,
                               eos_token_id=0, pad_token_id=0, sliding_window=8, **DECODER)
    if name == "distilbert":
        return T.DistilBertConfig(vocab_size=V, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                  max_position_embeddings=64, num_labels=3, dropout=0.0,
                                  attention_dropout=0.0, seq_classif_dropout=0.0)
    if name == "convnext":
        return T.ConvNextConfig(num_channels=3, patch_size=4, hidden_sizes=[8, 16], num_stages=2,
                                depths=[1, 1], image_size=16, num_labels=3)
    if name == "bert":
        return T.BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=64, num_labels=3, **NO_DROPOUT)
    if name == "vit":
        return T.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=16, patch_size=4, num_labels=3,
                           **NO_DROPOUT)
    return T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)


_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM", "bert": "BertForSequenceClassification",
            "distilbert": "DistilBertForSequenceClassification",
            "vit": "ViTForImageClassification", "resnet": "ResNetForImageClassification",
            "convnext": "ConvNextForImageClassification"}
ZOO = ["gpt2", "llama", "mistral", "bert", "distilbert", "vit", "resnet", "convnext"]


def _model(name):
    torch.manual_seed(0)
    return getattr(T, _CLASSES[name])(_config(name)).double().train()


def _batch(name, g, seq=S, pad=(0, 2, 0, 2)):
    """One batch of keyword inputs; ``pad[i]`` trailing pad tokens in row ``i``."""
    if name in ("vit", "resnet", "convnext"):
        return {"pixel_values": torch.randn(B, 3, 16, 16, dtype=torch.float64, generator=g),
                "labels": torch.randint(0, 3, (B,), generator=g)}
    ids = torch.randint(1, V, (B, seq), generator=g)
    mask = torch.ones(B, seq, dtype=torch.int64)
    for i, n in enumerate(pad):
        if n:
            mask[i, seq - n:] = 0
    if name in ("bert", "distilbert"):
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.randint(0, 3, (B,), generator=g)}
    # the causal LM's loss skips padding (-100); rows 0-1 and 2-3 (the places' halves)
    # hold equally many tokens, so the places' mean losses average to the batch's
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _batches(name, seqs=(S,) * STEPS, pad=(0, 2, 0, 2)):
    g = torch.Generator().manual_seed(1)
    return [_batch(name, g, seq, pad) for seq in seqs]


_CAPTURED = {}


def _captured(name, dynamic=False):
    """(model, main, startup, loss): ``name`` imported once, without an optimizer."""
    key = (name, dynamic)
    if key not in _CAPTURED:
        model = _model(name)
        feed = _batches(name)[0]
        dims = {k: {1: "seq"} for k in feed} if dynamic else None
        main, startup, loss = from_torch(model, feed, dynamic=dims)
        _CAPTURED[key] = (model, main, startup, loss)
    return _CAPTURED[key]


def _train_ssaexec(main, startup, loss, batches, places, strategy=None, merge=True):
    """(losses, local scopes) after training ``batches`` on ``places`` CPU places."""
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=scope,
                             build_strategy=strategy) as pe:
        losses = []
        for feed in batches:
            v, = pe.run([loss], feed=feed, return_merged=merge)
            losses.append(float(v) if merge else [float(x) for x in v])
        return losses, pe.local_scopes


def _train_eager(name, model, batches, opt_cls=torch.optim.SGD, halves=False, **kw):
    """Eager twin of ``model`` trained on ``batches``: (losses, twin).

    ``halves``: the loss is the mean of the two halves' losses, each half in its own
    forward (what 2 places or DDP compute where batch statistics are per place).
    """
    ref = _model(name)
    ref.load_state_dict(model.state_dict())
    opt = opt_cls(ref.parameters(), **kw)
    losses = []
    for feed in batches:
        opt.zero_grad()
        if halves:
            parts = [{k: v[:B // 2] for k, v in feed.items()},
                     {k: v[B // 2:] for k, v in feed.items()}]
            lv = sum(ref(**p).loss for p in parts) / 2
        else:
            lv = ref(**feed).loss
        lv.backward()
        opt.step()
        losses.append(float(lv.detach()))
    return losses, ref


def _assert_matches(losses, scopes, ref_losses, ref, tol=1e-6):
    assert losses == pytest.approx(ref_losses, rel=tol, abs=tol)
    for pname, p in ref.named_parameters():
        for scope in scopes:
            got = scope.find_var(pname)
            assert got is not None, pname
            assert torch.allclose(got, p.detach(), rtol=tol, atol=1e-9), pname


# --- acceptance 1: the zoo, 3 SGD steps on 1 and 2 places ---------------------------------------
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("places", [1, 2])
def test_zoo_trains_like_eager(name, places):
    model, main0, startup0, loss = _captured(name)
    main, startup = _with_optimizer(main0, startup0, se.optimizer.SGD(LR))
    batches = _batches(name)
    losses, scopes = _train_ssaexec(main, startup, loss, batches, places)
    # ResNet's batch norm normalises each place's share with its own statistics (as DDP
    # does): the eager reference runs the two halves apart
    ref_losses, ref = _train_eager(name, model, batches, lr=LR,
                                   halves=name == "resnet" and places == 2)
    _assert_matches(losses, scopes, ref_losses, ref)


def test_decoder_trains_with_adamw():
    model, main0, startup0, loss = _captured("llama")
    main, startup = _with_optimizer(main0, startup0, se.optimizer.AdamW(0.01))
    batches = _batches("llama")
    losses, scopes = _train_ssaexec(main, startup, loss, batches, 2)
    ref_losses, ref = _train_eager("llama", model, batches, torch.optim.AdamW, lr=0.01,
                                   weight_decay=0.01)
    _assert_matches(losses, scopes, ref_losses, ref)


# --- acceptance 2: padding -----------------------------------------------------------------------
def test_padded_batch_gives_eager_loss():
    """Unequal padding: 1 place is eager's loss; 2 places average their token means (as
    DDP does); fed ``num_items_in_batch`` (the batch's token count) with gradient scale
    "one", 2 places give the batch's token mean exactly."""
    model, main0, startup0, loss = _captured("llama")
    main, startup = _with_optimizer(main0, startup0, se.optimizer.SGD(LR))
    batches = _batches("llama", pad=(3, 0, 0, 7))
    one, scopes = _train_ssaexec(main, startup, loss, batches, 1)
    ref_losses, ref = _train_eager("llama", model, batches, lr=LR)
    _assert_matches(one, scopes, ref_losses, ref)

    two, scopes = _train_ssaexec(main, startup, loss, batches, 2)
    ddp_losses, ddp = _train_eager("llama", model, batches, lr=LR, halves=True)
    _assert_matches(two, scopes, ddp_losses, ddp)
    assert abs(two[0] - ref_losses[0]) > 1e-4  # the two means do differ here

    counted = [dict(f, num_items_in_batch=(f["labels"][:, 1:] != -100).sum()) for f in batches]
    cmain, cstartup, closs = from_torch(_model("llama"), counted[0],
                                        optimizer=se.optimizer.SGD(LR),
                                        unbatched=["num_items_in_batch"])
    per_place, scopes = _train_ssaexec(cmain, cstartup, closs, counted, 2,
                                       se.BuildStrategy(gradient_scale_strategy="one"),
                                       merge=False)
    _assert_matches([sum(v) for v in per_place], scopes, ref_losses, ref)


# --- acceptance 3: one program, several sequence lengths ----------------------------------------
def test_one_program_trains_sequence_lengths_16_and_32():
    model, main0, startup0, loss = _captured("llama", dynamic=True)
    main, startup = _with_optimizer(main0, startup0, se.optimizer.SGD(LR))
    assert main.global_block().var("input_ids").shape == [-1, -1]
    batches = _batches("llama", seqs=(16, 32, 16))
    for places in (1, 2):
        losses, scopes = _train_ssaexec(main, startup, loss, batches, places)
        ref_losses, ref = _train_eager("llama", model, batches, lr=LR)
        _assert_matches(losses, scopes, ref_losses, ref)


# --- tied weights, write_back, save_pretrained, evaluation ---------------------------------------
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_gpt2_trains_alike_under_every_zero_stage(opt):
    """Issue 49, acceptance 1 (one process, 1x2): 3 steps of each ZeRO stage equal the
    all-reduce run (float64, here to the last bit), every parameter sharded."""
    model, main0, startup0, loss = _captured("gpt2")
    optimizer = se.optimizer.SGD(LR) if opt == "sgd" else \
        se.optimizer.AdamW(0.01, weight_decay=0.1)
    main, startup = _with_optimizer(main0, startup0, optimizer)
    batches = _batches("gpt2")
    runs = {}
    for stage in (0, 1, 2, 3):
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                 se.BuildStrategy(zero_stage=stage), scope=se.Scope()) as pe:
            losses = [float(pe.run([loss], feed=f)[0]) for f in batches]
            runs[stage] = (losses, pe.gathered_state())
            if stage:
                assert len(pe.shard_layout()) == len(main.all_parameters())
    for stage in (1, 2, 3):
        assert runs[stage][0] == pytest.approx(runs[0][0], abs=1e-10, rel=0)
        for name, want in runs[0][1].items():
            assert torch.allclose(runs[stage][1][name], want, rtol=0, atol=1e-10), name


def test_tied_embedding_is_one_parameter_with_one_all_reduce(tmp_path):
    model, main0, startup0, loss = _captured("gpt2")
    block = main0.global_block()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not block.has_var("lm_head.weight")
    assert block.has_var(grad_var_name("transformer.wte.weight"))
    graph = se.build_ssa_graph(main0, se.cpu_places(2), se.BuildStrategy())
    reduced = [h.inputs[0].name for h in graph.ops_of_kind(AllReduceOpHandle)]
    assert reduced.count(grad_var_name("transformer.wte.weight")) == 1
    assert len(reduced) == len(main0.all_parameters())

    main, startup = _with_optimizer(main0, startup0, se.optimizer.SGD(LR))
    trained = _model("gpt2")
    trained.load_state_dict(model.state_dict())
    batches = _batches("gpt2")
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        for feed in batches:
            pe.run([loss], feed=feed)
        write_back(pe, trained)
    _, ref = _train_eager("gpt2", model, batches, lr=LR)
    assert trained.lm_head.weight is trained.transformer.wte.weight
    for (n, p), q in zip(trained.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-9), n
    trained.save_pretrained(tmp_path)
    again = T.GPT2LMHeadModel.from_pretrained(tmp_path, local_files_only=True).double()
    saved, loaded = trained.state_dict(), again.state_dict()
    assert saved.keys() == loaded.keys()
    for k in saved:
        assert torch.equal(saved[k], loaded[k]), k

    # the evaluation import picks the logits out of the ModelOutput
    test, test_startup, out = from_torch(trained, {"input_ids": batches[0]["input_ids"]},
                                         for_test=True, output="logits")
    with se.ParallelExecutor(se.cpu_places(2), test, test_startup, scope=se.Scope()) as ev:
        logits, = ev.run([out], feed={"input_ids": batches[0]["input_ids"]})
    with torch.no_grad():
        want = again.eval()(input_ids=batches[0]["input_ids"]).logits
    assert torch.allclose(logits, want, rtol=1e-9, atol=1e-12)


def test_loss_fn_reads_the_picked_output():
    """``output="logits"`` with a ``loss_fn``: the user's loss on the model's logits."""
    import torch.nn.functional as F

    def shifted_ce(logits, target):
        return F.cross_entropy(logits[:, :-1].reshape(-1, V), target[:, 1:].reshape(-1))

    model = _model("gpt2")
    batches = [{"input_ids": f["input_ids"], "target": f["input_ids"]}
               for f in _batches("gpt2")]
    main, startup, loss = from_torch(model, batches[0], loss_fn=shifted_ce, output="logits",
                                     optimizer=se.optimizer.SGD(LR))
    losses, scopes = _train_ssaexec(main, startup, loss, batches, 2)
    ref = _model("gpt2")
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref_losses = []
    for f in batches:
        opt.zero_grad()
        lv = shifted_ce(ref(input_ids=f["input_ids"]).logits, f["target"])
        lv.backward()
        opt.step()
        ref_losses.append(float(lv.detach()))
    _assert_matches(losses, scopes, ref_losses, ref)


def test_saved_hf_program_reloads(tmp_path):
    """The imported program is an ordinary program file: JSON round trip, same losses."""
    _, main0, startup0, loss = _captured("llama")
    main, startup = _with_optimizer(main0, startup0, se.optimizer.SGD(LR))
    se.save_program(main, os.fspath(tmp_path / "m.json"))
    se.save_program(startup, os.fspath(tmp_path / "s.json"))
    batches = _batches("llama")
    a, _ = _train_ssaexec(main, startup, loss, batches, 2)
    b, _ = _train_ssaexec(se.load_program(os.fspath(tmp_path / "m.json")),
                          se.load_program(os.fspath(tmp_path / "s.json")), loss, batches, 2)
    assert a == b



def test_example_trains_a_causal_lm(tmp_path):
    """``examples/train_hf_causal_lm.py``: the loss falls; the saved model reloads."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))), "examples",
                        "train_hf_causal_lm.py")
    spec = importlib.util.spec_from_file_location("train_hf_causal_lm", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    lines = []
    losses, model, _ = example.train(steps=20, batch_size=8, places="cpu:2",
                                     save=os.fspath(tmp_path), log=lines.append)
    assert losses[-1] < 0.7 * losses[0], losses
    assert any(line.startswith("completion: 'the cat ") for line in lines)
    again = T.LlamaForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    for k, v in again.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


@pytest.mark.processes  # DDP's 2 gloo processes
def test_bench_compares_hf_llama_with_ddp(tmp_path, capsys):
    """``ssaexec bench --model hf-llama`` (tiny sizes): ssaexec on 2 places and DDP with
    2 processes train the same imported model from the same weights on the same batch."""
    import json

    from ssaexec import harness as bench
    out = tmp_path / "r.json"
    # eager's own process is left out (a few seconds of the suite): DDP is the peer here
    rc = bench.main(["--model", "hf-llama", "--places", "cpu:2", "--place-counts", "2",
                     "--modes", "ssaexec,torch-ddp",
                     "--vocab", "200", "--d-model", "32", "--seq-len", "8", "-b", "2",
                     "--warmup", "1", "--steps", "2", "--repeats", "1", "--json", str(out),
                     "--plot", "none", "--no-progress"])
    assert rc == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["settings"]["preset"] == "hf-llama"
    runs = {(r["mode"], r["places"]): r["losses"] for r in result["runs"]}
    assert set(runs) == {("ssaexec", 2), ("torch-ddp", 2)}
    assert runs[("ssaexec", 2)] == pytest.approx(runs[("torch-ddp", 2)], rel=1e-4)


def test_bench_hf_bert_trainers_agree():
    """``--model hf-bert``'s preset, program and twin: one ssaexec place trains as eager."""
    import argparse

    from ssaexec.harness import add_arguments
    from ssaexec.harness.cli import settings
    from ssaexec.harness.runners import EagerTrainer, ParallelTrainer
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--model", "hf-bert", "--vocab", "100", "--d-model", "32", "--seq-len", "8", "-b", "4"])
    s = settings(args)
    assert (s["preset"], s["modes"], s["layers"], s["heads"]) == \
        ("hf-bert", "ssaexec,torch-eager,torch-ddp", 2, 2)
    cfg = {"mode": "ssaexec", "places": 1, "device": "cpu", "settings": s}
    ours, eager = ParallelTrainer(cfg), EagerTrainer(dict(cfg, mode="torch-eager"))
    try:
        a = [ours.step() for _ in range(3)]
        b = [eager.step() for _ in range(3)]
    finally:
        ours.close()
    assert a == pytest.approx(b, rel=1e-4) and a[-1] < a[0]
