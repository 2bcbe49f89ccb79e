"""Train a small Hugging Face Llama, data-parallel on this machine's places, with ssaexec.

    python examples/train_hf_causal_lm.py --steps 60            # every CPU core / GPU
    python examples/train_hf_causal_lm.py --places cpu:2 --save out/tiny-llama

The model is ``transformers``' own ``LlamaForCausalLM`` (grouped-query attention,
rotary embeddings, RMSNorm, SDPA), built from a small config: no weights are
downloaded. The script makes its toy corpus itself (sentences from a tiny grammar,
read character by character), pads each batch to its longest line with an
``attention_mask``, and hands ``se.from_torch`` the keyword inputs the model takes;
the model's own ``loss`` output is the loss. The sequence dimension is dynamic, so
one program trains batches of any length. At the end ``write_back`` puts the
trained weights into the model, which greedily completes a prompt and, with
``--save``, is written with ``save_pretrained``.

Needs ``pip install transformers`` (``make test`` installs it).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ssaexec as se  # noqa: E402
from ssaexec.frontends.torch import write_back  # noqa: E402

SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "a small bird"]
VERBS = ["sees", "likes", "follows", "finds"]
OBJECTS = ["the ball", "a red box", "the garden", "a tall tree", "the river"]
PAD = 0


def corpus(lines, seed=0):
    """``lines`` seeded sentences of the grammar, e.g. ``"a dog likes the river."``."""
    g = torch.Generator().manual_seed(seed)

    def pick(words):
        return words[int(torch.randint(len(words), (1,), generator=g))]
    return [f"{pick(SUBJECTS)} {pick(VERBS)} {pick(OBJECTS)}." for _ in range(lines)]


class CharVocab:
    """Characters to token ids; 0 is padding, 1 starts a line."""

    def __init__(self, text):
        self.chars = sorted(set("".join(text)))
        self.ids = {c: i + 2 for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars) + 2

    def encode(self, line):
        return [1] + [self.ids[c] for c in line]

    def decode(self, ids):
        return "".join(self.chars[i - 2] for i in ids if i >= 2)


def batch(vocab, lines):
    """Keyword inputs of a padded batch: ``input_ids``, ``attention_mask``, ``labels``."""
    rows = [vocab.encode(line) for line in lines]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    mask = (ids != PAD).to(torch.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def build_model(vocab_size, seed=0):
    """A 2-layer Llama with 4 query and 2 key/value heads, from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1,
                         eos_token_id=1, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def complete(model, vocab, prompt, n=24):
    """Greedy continuation of ``prompt`` by the (eager) model."""
    ids = torch.tensor([vocab.encode(prompt)])
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            if vocab.decode([int(nxt)]) == ".":
                break
    return vocab.decode(ids[0].tolist())


def train(steps=60, batch_size=16, places=None, lr=3e-3, seed=0, save=None, log=print):
    """Train ``steps`` steps of ``batch_size`` lines; return (losses, model, vocab)."""
    lines = corpus(batch_size * steps, seed)
    vocab = CharVocab(lines)
    model = build_model(len(vocab), seed)
    places = se.parse_places(places) if places else (se.cuda_places() or se.cpu_places())
    if batch_size % len(places):
        raise SystemExit(f"--batch-size {batch_size} must be a multiple of the "
                         f"{len(places)} places")
    batches = [batch(vocab, lines[i:i + batch_size]) for i in range(0, len(lines), batch_size)]
    main, startup, loss = se.from_torch(model.train(), batches[0],
                                        optimizer=se.optimizer.AdamW(lr),
                                        dynamic={k: {1: "seq"} for k in batches[0]})
    log(f"imported {type(model).__name__}: {len(main.global_block().ops)} ops, "
        f"{sum(p.numel() for p in model.parameters())} parameters; training on "
        f"{len(places)} place(s), {batch_size} lines a step")
    losses = []
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe:
        for step, feed in enumerate(batches):
            feed = {k: v.to(places[0].device) if places[0].is_cuda else v
                    for k, v in feed.items()}
            losses.append(float(pe.run([loss], feed=feed)[0]))
            if step % 10 == 0 or step == len(batches) - 1:
                log(f"step {step:3d}  length {feed['input_ids'].shape[1]:2d}  "
                    f"loss {losses[-1]:.3f}")
        write_back(pe, model)
    log(f"completion: {complete(model, vocab, 'the cat ')!r}")
    if save:
        model.save_pretrained(save)
        log(f"saved to {save} (LlamaForCausalLM.from_pretrained({save!r}) reloads it)")
    return losses, model, vocab


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--places", default=None, help="cpu:N, cuda or cuda:0,1 (default: all)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", default=None, help="save_pretrained the trained model here")
    args = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        raise SystemExit("this example needs transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    losses, _, _ = train(args.steps, args.batch_size, args.places, args.lr, args.seed,
                         args.save)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
