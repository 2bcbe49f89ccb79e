"""``from_torch``'s inputs and outputs as users have them, without ``transformers``.

``output=`` (a key, an index or a callable) picks the loss or what ``loss_fn``
reads; a forward returning a dict uses its ``"loss"``; ``dynamic=`` names symbolic
dimensions besides the batch, so one program runs any sequence length; model code
that asks ``torch.compiler.is_exporting()`` sees the capture as an export; and the
ops torch 2.13 cannot trace with a symbolic batch (``F.pad``, a channels-last
``adaptive_avg_pool1d``) import. Every bad argument is a ``ProgramError`` saying what
to write instead. Small models, float64, compared with eager to 1e-9.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.frontends.torch import from_torch

LR = 0.1


class Tagger(nn.Module):
    """Token classifier over a sequence: an embedding, a conv over positions, a head.

    Returns a dict like a transformers ``ModelOutput``: ``logits`` and, given
    ``labels``, the ``loss`` (a mean over the tokens whose ``mask`` is 1).
    """

    def __init__(self, vocab=20, d=6, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.conv = nn.Conv1d(d, d, 3, padding=1)
        self.head = nn.Linear(d, classes)

    def forward(self, ids, mask, labels=None):
        h = self.emb(ids) * mask.unsqueeze(-1)
        h = torch.relu(self.conv(h.transpose(1, 2))).transpose(1, 2)
        logits = self.head(h + h.mean(1, keepdim=True))
        out = {"logits": logits}
        if labels is not None:
            per_token = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            out["loss"] = (per_token * mask).sum() / mask.sum()
        return out


def _tagger():
    torch.manual_seed(0)
    return Tagger().double()


def _feed(seq, g, batch=4):
    ids = torch.randint(0, 20, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.float64)
    mask[1, -2:] = 0
    mask[3, -2:] = 0
    return {"ids": ids, "mask": mask, "labels": torch.randint(0, 3, (batch, seq), generator=g)}


def _train(main, startup, loss, feeds, places):
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed=f)[0]) for f in feeds]
        return losses, {n: pe.get_var(n) for n in
                        [p.name for p in main.all_parameters()]}


def _eager(model, feeds, loss_of):
    ref = _tagger()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    losses = []
    for f in feeds:
        opt.zero_grad()
        lv = loss_of(ref, f)
        lv.backward()
        opt.step()
        losses.append(float(lv.detach()))
    return losses, dict(ref.named_parameters())


def _assert_close(got, want):
    (losses, params), (ref_losses, ref_params) = got, want
    assert losses == pytest.approx(ref_losses, rel=1e-9, abs=1e-12)
    assert params.keys() == ref_params.keys()
    for n, p in ref_params.items():
        assert torch.allclose(params[n], p.detach(), rtol=1e-9, atol=1e-12), n


def test_dict_output_loss_and_dynamic_sequence_length():
    model = _tagger()
    g = torch.Generator().manual_seed(1)
    feeds = [_feed(seq, g) for seq in (8, 12, 5, 8)]
    dims = {"ids": {1: "seq"}, "mask": {-1: "seq"}, "labels": {1: "seq"}}
    main, startup, loss = from_torch(model, feeds[0], optimizer=se.optimizer.SGD(LR),
                                     dynamic=dims)
    block = main.global_block()
    assert [block.var(n).shape for n in ("ids", "mask", "labels")] == [[-1, -1]] * 3
    want = _eager(model, feeds, lambda m, f: m(**f)["loss"])
    for places in (1, 2):
        _assert_close(_train(main, startup, loss, feeds, places), want)


@pytest.mark.parametrize("output", ["logits", 0, lambda out: out["logits"]])
def test_output_picks_what_loss_fn_reads(output):
    class AsTuple(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask):
            out = self.inner(ids, mask)
            return (out["logits"], mask) if output == 0 else out

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, 3), target.reshape(-1))

    model = _tagger()
    g = torch.Generator().manual_seed(2)
    feeds = [{k: v for k, v in _feed(6, g).items() if k != "labels"} for _ in range(3)]
    for f in feeds:
        f["target"] = torch.randint(0, 3, (4, 6), generator=g)
    main, startup, loss = from_torch(AsTuple(model), feeds[0], loss_fn=loss_fn, output=output,
                                     optimizer=se.optimizer.SGD(LR))
    got = _train(main, startup, loss, feeds, 2)
    got = (got[0], {n.removeprefix("inner."): v for n, v in got[1].items()})
    want = _eager(model, feeds, lambda m, f: loss_fn(m(f["ids"], f["mask"])["logits"],
                                                      f["target"]))
    _assert_close(got, want)


def test_for_test_output_of_a_dict():
    model = _tagger()
    g = torch.Generator().manual_seed(3)
    f = _feed(7, g)
    del f["labels"]
    with pytest.raises(se.ProgramError, match=r"dict with keys \['logits'\].*output='logits'"):
        from_torch(model, f, for_test=True)
    main, startup, out = from_torch(model, f, for_test=True, output="logits",
                                    dynamic={"ids": {1: "seq"}, "mask": {1: "seq"}})
    with se.ParallelExecutor(se.cpu_places(2), main, startup, scope=se.Scope()) as pe:
        for seq in (7, 3):
            f = _feed(seq, g)
            del f["labels"]
            got, = pe.run([out], feed=f)
            with torch.no_grad():
                assert torch.allclose(got, model(**f)["logits"], rtol=1e-12, atol=1e-12)


class _Exporting(nn.Module):
    """Takes a data-dependent shortcut unless the capture looks like torch.export."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if not torch.compiler.is_exporting() and bool((x == 0).all()):
            return self.fc(x) * 0
        return self.fc(x)


def test_capture_is_seen_as_an_export():
    x = torch.randn(4, 4, dtype=torch.float64)
    main, startup, loss = from_torch(_Exporting().double(), {"x": x, "target": x[:, :2]},
                                     loss_fn=F.mse_loss)
    assert loss == "loss" and main.global_block().ops


class _PadPool(nn.Module):
    """A conv then F.pad (MobileNetV2's "same" padding) and a pool over a transposed
    sequence (Swin's pooler: adaptive_avg_pool1d replays channels-last strides)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.head = nn.Linear(3, 2)
        self.pool = nn.AdaptiveAvgPool1d(1)

    def forward(self, x):
        h = F.pad(torch.relu(self.conv(x)), [1, 2, 0, 1])
        seq = h.flatten(2).transpose(1, 2)                      # [n, positions, 3]
        return self.head(self.pool(seq.transpose(1, 2)).flatten(1))


def test_pad_and_pooled_transpose_keep_the_batch_symbolic():
    torch.manual_seed(0)
    model = _PadPool().double()
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(b, 2, 6, 6, dtype=torch.float64, generator=g) for b in (4, 6, 4)]
    ys = [torch.randint(0, 2, (x.shape[0],), generator=g) for x in xs]
    main, startup, loss = from_torch(model, {"x": xs[0], "target": ys[0]},
                                     loss_fn=F.cross_entropy, optimizer=se.optimizer.SGD(LR))
    types = {op.type for op in main.global_block().ops}
    assert not any("as_strided" in t or "constant_pad_nd" in t for t in types)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed={"x": x, "target": y})[0])
                  for x, y in zip(xs, ys, strict=True)]
        params = {p.name: pe.get_var(p.name) for p in main.all_parameters()}
    torch.manual_seed(0)
    ref = _PadPool().double()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for (x, y), want in zip(zip(xs, ys, strict=True), losses, strict=True):
        opt.zero_grad()
        lv = F.cross_entropy(ref(x), y)
        lv.backward()
        opt.step()
        assert float(lv.detach()) == pytest.approx(want, rel=1e-9)
    for n, p in ref.named_parameters():
        assert torch.allclose(params[n], p.detach(), rtol=1e-9, atol=1e-12), n


class _FixesSeq(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4 * 6, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).reshape(ids.shape[0], 4 * 6)).mean()


class _TwoLengths(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, a, b):
        return (self.emb(a) + self.emb(b)).mean()


def _ids(*shape):
    return torch.randint(0, 10, shape)


@pytest.mark.parametrize("module,inputs,kw,pattern", [
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic={"ids": {1: "seq"}}),
     r"fixes dimension 1 of input 'ids' \(named 'seq' in dynamic=\) to 6"),
    (_TwoLengths(), {"a": _ids(3, 5), "b": _ids(3, 5)},
     dict(dynamic={"a": {1: "n"}, "b": {1: "m"}}),
     r"makes dimensions 'n' and 'm' equal .*give them one name"),
    (_TwoLengths(), {"a": _ids(3, 5), "b": _ids(3, 4)},
     dict(dynamic={"a": {1: "n"}, "b": {1: "n"}}),
     r"dimension 1 of 'a' and dimension 1 of 'b' are both 'n' but have sizes 5 and 4"),
    (_TwoLengths(), {"a": _ids(3, 5), "b": _ids(15)}, {},
     r"'a' and dimension 0 of 'b' are both the batch but have sizes 3 and 15 .*unbatched="),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic={"x": {1: "seq"}}),
     r"names input 'x', which is not an example input"),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic={"ids": {2: "seq"}}),
     r"names dimension 2, but the example input has shape \[3, 6\]"),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic={"ids": {0: "b"}}),
     r"dimension 0 of 'ids' is the batch"),
    (_FixesSeq(), {"ids": _ids(3, 1)}, dict(dynamic={"ids": {1: "seq"}}),
     r"dimension 1 \('seq'\) of example input 'ids' has size 1"),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic={"ids": {1: "@batch"}}),
     r"must be a name such as 'seq'"),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(dynamic=[("ids", 1)]),
     r"dynamic= must be a dict"),
    (_FixesSeq(), {"ids": _ids(3, 6)}, dict(output="logits", loss_fn=F.cross_entropy),
     r"with loss_fn, example_inputs must also hold 'target'"),
])
def test_bad_dynamic_and_output_arguments(module, inputs, kw, pattern):
    with pytest.raises(se.ProgramError, match=pattern):
        from_torch(module, inputs, **kw)


def test_dict_without_loss_and_output_that_picks_nothing():
    model = _tagger()
    f = _feed(5, torch.Generator().manual_seed(5))
    del f["labels"]
    with pytest.raises(se.ProgramError, match=r"returns a dict with keys \['logits'\] and no "
                                              r"'loss': feed what makes the model compute"):
        from_torch(model, f)
    with pytest.raises(se.ProgramError, match=r"output='scores' picks nothing from the dict "
                                              r"with keys \['logits'\]"):
        from_torch(model, f, for_test=True, output="scores")


class _SharedEmbedding(nn.Module):
    """T5's and BART's layout: ``shared`` is registered first and read only through its
    aliases (encoder, decoder, tied head); ``spare`` is never read."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(12, 4)
        self.enc, self.dec = nn.Embedding(12, 4), nn.Embedding(12, 4)
        self.head = nn.Linear(4, 12, bias=False)
        self.enc.weight = self.dec.weight = self.head.weight = self.shared.weight
        self.spare = nn.Linear(4, 4)

    def forward(self, ids):
        return self.head(torch.tanh(self.enc(ids)) + self.dec(ids.flip(1)))


def test_parameter_names_the_forward_never_reads():
    torch.manual_seed(0)
    model = _SharedEmbedding().double()
    g = torch.Generator().manual_seed(6)
    feeds = [{"ids": torch.randint(0, 12, (4, 5), generator=g)} for _ in range(3)]
    for f in feeds:
        f["target"] = torch.randint(0, 12, (4, 5), generator=g)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, 12), target.reshape(-1))

    main, startup, loss = from_torch(model, feeds[0], loss_fn=loss_fn,
                                     optimizer=se.optimizer.SGD(LR))
    block = main.global_block()
    assert [p.name for p in main.all_parameters()] == ["shared.weight", "spare.weight",
                                                       "spare.bias"]
    assert block.has_var("shared.weight@GRAD") and not block.has_var("spare.weight@GRAD")
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed=f)[0]) for f in feeds]
        got = {n: pe.get_var(n) for n in ("shared.weight", "spare.weight")}
    torch.manual_seed(0)
    ref = _SharedEmbedding().double()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for f, want in zip(feeds, losses, strict=True):
        opt.zero_grad()
        lv = loss_fn(ref(f["ids"]), f["target"])
        lv.backward()
        opt.step()
        assert float(lv.detach()) == pytest.approx(want, rel=1e-9)
    assert torch.allclose(got["shared.weight"], ref.shared.weight.detach(), rtol=1e-9)
    assert torch.equal(got["spare.weight"], model.spare.weight.detach())  # no update


@torch.library.custom_op("ssaexec_test::export_only", mutates_args=())
def _export_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@_export_only.register_fake
def _(x):
    return torch.empty_like(x)


_export_only.register_autograd(lambda ctx, grad: grad)


class _ExportBranch(nn.Module):
    """Like Mixtral's experts: a custom op on the export branch only."""

    def __init__(self):
        super().__init__()
        self.experts = nn.Linear(4, 4)

    def forward(self, x):
        h = self.experts(x)
        return _export_only(h) if torch.compiler.is_exporting() else h + 1


def test_error_location_follows_the_export_branch():
    model = nn.Sequential(nn.Linear(4, 4), _ExportBranch())
    x = torch.randn(4, 4)
    with pytest.raises(se.ProgramError, match=r"ssaexec_test.export_only.default .* in module "
                                              r"'1' \(_ExportBranch\)"):
        from_torch(model, {"input": x, "target": x}, loss_fn=F.mse_loss)

