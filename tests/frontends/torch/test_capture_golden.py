"""``from_torch`` imports one module as one program on every supported torch (issue 47).

A few small modules, each a construct whose trace differs between torch versions
(scaled_dot_product_attention's overloads and dtypes, tied and shared embeddings (the
no-gradient retry), batch norm, a conv), are imported, and each program's summary (every op of the main block in
order: its type, its inputs' dtypes, its outputs' dtypes and shapes; no var names,
which torch numbers as it likes) must equal the golden one in
tests/fixtures/capture_golden.json. The same file holds on torch 2.11, 2.13 and 2.14
(``make test-matrix`` runs this test on each); ``SSAEXEC_UPDATE_GOLDEN=1`` rewrites it
from the running torch (then check the diff on the others).
"""

import json
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F

from ssaexec.frontends.torch import from_torch

GOLDEN = pathlib.Path(__file__).parent.parent.parent / "fixtures" / "capture_golden.json"
B = 4


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Attention(torch.nn.Module):
    """One causal self-attention block through ``F.scaled_dot_product_attention``."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d)).mean()


class TiedLM(torch.nn.Module):
    """A language model whose output head shares the embedding's weight."""

    def __init__(self, vocab=16, d=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids)))


class SharedEmbedding(torch.nn.Module):
    """T5's and BART's layout: ``shared`` is registered first and read only through its
    aliases; ``spare`` is never read (the capture's no-gradient retry)."""

    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Embedding(16, 8)
        self.enc, self.head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16, bias=False)
        self.enc.weight = self.head.weight = self.shared.weight
        self.spare = torch.nn.Linear(8, 8)

    def forward(self, ids):
        return self.head(torch.tanh(self.enc(ids)))


def _lm_loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _cases():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (B, 5), generator=g)
    return {
        "mlp": (MLP, {"x": torch.randn(B, 6, generator=g),
                      "target": torch.randint(0, 3, (B,), generator=g)}, F.cross_entropy),
        "conv_bn": (ConvBN, {"x": torch.randn(B, 3, 6, 6, generator=g),
                             "target": torch.randint(0, 3, (B,), generator=g)},
                    F.cross_entropy),
        "sdpa": (Attention, {"x": torch.randn(B, 5, 8, generator=g)}, None),
        "sdpa_f64": (lambda: Attention().double(),
                     {"x": torch.randn(B, 5, 8, generator=g, dtype=torch.float64)}, None),
        "sdpa_bf16": (lambda: Attention().to(torch.bfloat16),
                      {"x": torch.randn(B, 5, 8, generator=g).to(torch.bfloat16)}, None),
        "tied_lm": (TiedLM, {"ids": ids, "target": torch.randint(0, 16, (B, 5), generator=g)},
                    _lm_loss),
        "shared_embedding": (lambda: SharedEmbedding().double(),
                             {"ids": ids, "target": torch.randint(0, 16, (B, 5), generator=g)},
                             _lm_loss),
        "tied_lm_f64": (lambda: TiedLM().double(),
                        {"ids": ids, "target": torch.randint(0, 16, (B, 5), generator=g)},
                        _lm_loss),
    }


def summary(main):
    """The program's ops in order as ``"type (in dtypes) -> out dtype[shape], ..."``."""
    block = main.global_block()

    def desc(name):
        v = block.find_var(name)
        return "?" if v is None else f"{v.dtype}{v.shape}"

    lines = []
    for op in block.ops:
        ins = [block.find_var(n) for n in op.input_names()]
        outs = [desc(n) for n in op.output_names()]
        lines.append(f"{op.type} ({', '.join(v.dtype if v else '?' for v in ins)}) -> "
                     f"{', '.join(outs)}")
    return lines


def _imported(name):
    cls, feed, loss_fn = _cases()[name]
    torch.manual_seed(0)
    main, _, _ = from_torch(cls(), feed, loss_fn=loss_fn)
    return summary(main)


def _summaries():
    return {name: _imported(name) for name in _cases()}


_CACHE = {}


def _current(name):
    if name not in _CACHE:
        _CACHE[name] = _imported(name)
    return _CACHE[name]


@pytest.mark.skipif(os.environ.get("SSAEXEC_UPDATE_GOLDEN") != "1",
                    reason="SSAEXEC_UPDATE_GOLDEN=1 rewrites the golden file")
def test_write_golden():
    GOLDEN.write_text(json.dumps(_summaries(), indent=1) + "\n")


@pytest.mark.parametrize("name", ["mlp", "conv_bn", "sdpa", "sdpa_f64", "sdpa_bf16", "tied_lm",
                                  "tied_lm_f64", "shared_embedding"])
def test_program_matches_the_golden_summary_on_this_torch(name):
    golden = json.loads(GOLDEN.read_text())
    got = _current(name)
    assert got == golden[name], (
        f"from_torch on torch {torch.__version__} imports {name!r} differently from the "
        "golden program (tests/fixtures/capture_golden.json); normalise the difference at "
        "capture (frontends/torch/capture.py)")


def test_sdpa_is_one_cpu_flash_attention_op():
    # the normalised overload: every supported torch traces SDPA on CPU to this op
    types = [line.split(" ")[0] for line in _current("sdpa")]
    assert types.count("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1
    assert types.count("aten._scaled_dot_product_flash_attention_for_cpu_backward.default") == 1
