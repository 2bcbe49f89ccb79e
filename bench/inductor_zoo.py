"""The zoo's GPT-2 and BERT under the compiler, against eager PyTorch (issue 32, acceptance
1: float64, 3 SGD steps and 3 AdamW steps equal eager within 1e-6 on 1 and 2 places).

``python bench/inductor_zoo.py [--models gpt2,bert] [--places 1,2] [--steps 3]
[--dtype float64|float32] [--json F]`` (float32: acceptance's 5 steps within 1e-4)

Each ``transformers`` model is built from a small config (never downloaded; the configs of
``tests/frontends/torch/test_zoo.py``: 2 layers, width 32, 4 heads, vocabulary 64, dropout off), in
float64 (or float32), imported with ``se.from_torch`` and trained with ``compiler="inductor"``; its
eager twin (the same initial parameters) trains with ``torch.optim`` on the same batches.
The table gives the largest difference of the losses and of any parameter, and the
graphs compiled and the ones that ran uncompiled. The loss difference is relative:
``transformers`` computes GPT-2's loss in float32 (it casts the logits), in eager too. No padding: each place's half of the
batch holds as many tokens, so the places' mean losses average to eager's batch mean.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ssaexec as se  # noqa: E402
from ssaexec.frontends.torch import from_torch  # noqa: E402

B, S, V = 4, 16, 64
RATES = {"sgd": 0.1, "adamw": 0.01}


def _model(name, dtype=torch.float64):
    import transformers as T
    T.logging.set_verbosity_error()
    torch.manual_seed(0)
    if name == "gpt2":
        config = T.GPT2Config(vocab_size=V, n_layer=2, n_embd=32, n_head=4, n_positions=64,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                              bos_token_id=0, eos_token_id=0)
        return T.GPT2LMHeadModel(config).to(dtype).train()
    config = T.BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    return T.BertForSequenceClassification(config).to(dtype).train()


def _batches(name, steps):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        ids = torch.randint(1, V, (B, S), generator=g)
        labels = torch.randint(0, 3, (B,), generator=g) if name == "bert" else ids
        out.append({"input_ids": ids, "attention_mask": torch.ones(B, S, dtype=torch.int64),
                    "labels": labels})
    return out


def _ssaexec_optimizer(opt):
    # AdamW's weight decay as torch.optim.AdamW's default (0.01)
    return se.optimizer.SGD(RATES[opt]) if opt == "sgd" else se.optimizer.AdamW(RATES[opt])


def _torch_optimizer(opt, params):
    return (torch.optim.SGD(params, lr=RATES[opt]) if opt == "sgd"
            else torch.optim.AdamW(params, lr=RATES[opt], weight_decay=0.01))


def compare(name, opt, places, steps, dtype=torch.float64):
    """One row: largest loss and parameter differences, compiles, fallbacks."""
    batches = _batches(name, steps)
    model = _model(name, dtype)
    main, startup, loss = from_torch(model, batches[0], optimizer=_ssaexec_optimizer(opt))
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=scope,
                             exec_strategy=se.ExecutionStrategy(compiler="inductor")) as pe:
        losses = [float(pe.run([loss], feed=f)[0]) for f in batches]
        lowering = pe._runner((loss,)).lowering
    twin = _model(name, dtype)
    twin.load_state_dict(model.state_dict())
    torch_opt = _torch_optimizer(opt, twin.parameters())
    ref = []
    for f in batches:
        torch_opt.zero_grad()
        lv = twin(**f).loss
        lv.backward()
        torch_opt.step()
        ref.append(float(lv.detach()))
    # relative: transformers computes GPT-2's loss in float32 (it casts the logits), so
    # the loss itself is float32 on both sides; the parameters stay float64
    loss_diff = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(losses, ref, strict=True))
    param_diff = max(float((scope.find_var(n) - p.detach()).abs().max())
                     for n, p in twin.named_parameters())
    return dict(model=name, dtype=str(dtype).removeprefix("torch."), optimizer=opt,
                places=places, steps=steps,
                max_loss_diff=loss_diff, max_param_diff=param_diff,
                compiles=lowering.compiles, fallbacks=lowering.fallbacks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,bert")
    ap.add_argument("--optimizers", default="sgd,adamw")
    ap.add_argument("--places", default="1,2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                    help="float32: the target is 1e-4 (after 5 steps), float64: 1e-6")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("bench/inductor_zoo.py needs transformers (pip install transformers)")
    tol = 1e-6 if args.dtype == "float64" else 1e-4
    rows = []
    for name in args.models.split(","):
        for opt in args.optimizers.split(","):
            for places in (int(p) for p in args.places.split(",")):
                row = compare(name, opt, places, args.steps, getattr(torch, args.dtype))
                rows.append(row)
                ok = max(row["max_loss_diff"], row["max_param_diff"]) <= tol
                print(f"{name:5s} {opt:6s} {places} place(s): loss rel. diff "
                      f"{row['max_loss_diff']:.1e}, params |diff| {row['max_param_diff']:.1e}"
                      f" ({'within' if ok else 'OVER'} {tol:g}), {row['compiles']} compiled, "
                      f"{len(row['fallbacks'])} uncompiled", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": os.uname().nodename, "torch": torch.__version__,
                       "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
