"""DataLoader: background preparation of per-place feeds."""

import threading

import pytest
import torch

import ssaexec as se
from ssaexec.data.loader import DataLoader
from ssaexec.program.example_models import build_mlp


def _batches(k, b=6):
    g = torch.Generator().manual_seed(0)
    return [{"img": torch.randn(b, 4, generator=g),
             "label": torch.randint(0, 10, (b, 1), generator=g)} for _ in range(k)]


def test_loader_feeds_train_like_plain_feeds():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    batches = _batches(5)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        plain = [pe.run([loss], feed=b)[0] for b in batches]
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe, \
            DataLoader(batches, pe.places) as loader:
        loaded = [pe.run([loss], feed=f)[0] for f in loader]
    assert torch.equal(torch.stack(plain), torch.stack(loaded))


def test_loader_runs_ahead_and_stops():
    before = set(threading.enumerate())
    produced = []
    ahead = threading.Event()

    def source():
        for b in _batches(10):
            produced.append(1)
            if len(produced) == 4:
                ahead.set()
            yield b

    loader = DataLoader(source(), se.cpu_places(2), prefetch=3)
    first = next(loader)
    assert [f["img"].shape[0] for f in first] == [3, 3]
    # prepared ahead while the consumer was busy (an event, not a sleep: a loaded machine
    # may take its time, but the loader must get there without another next())
    assert ahead.wait(60)
    loader.close()
    assert set(threading.enumerate()) - before == set()


def test_loader_reraises_source_errors():
    def source():
        yield _batches(1)[0]
        raise ValueError("broken source")

    loader = DataLoader(source(), se.cpu_places(2))
    next(loader)
    with pytest.raises(ValueError, match="broken source"):
        next(loader)
    with pytest.raises(se.FeedError, match="batch size 1"):
        next(DataLoader([{"img": torch.randn(1, 4)}], se.cpu_places(2)))
