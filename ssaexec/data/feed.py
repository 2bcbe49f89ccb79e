"""Feed policy, in one place for both executors, the data loader and ``distributed``.

Checking. A feed value may be a torch tensor, a NumPy array or a nested list.
Tensors and arrays must already have the declared dtype (silent casts hide bugs such
as float64 NumPy data fed to a float32 model); lists are converted to it. The value
must then fit its declaration by the rule every value entering a step follows
(``runtime.boundary``: a dense tensor of the declared dtype, rank and every declared
dimension other than -1), and be on a device its place can copy it from.

Splitting (``place_feeds``). A dict feed is split along dim 0 for data vars whose
first declared dim is -1 (every split var of one step must have the same batch size);
other data vars are shared by every place; a persistable var may be fed only with
``allow_persistable_feed`` and is then copied once per place, never the caller's
tensor. A list of dicts feeds each place its own.

Binding and forgetting. ``bind_feeds`` copies each place's part to its device (a
part already there, such as a slice of a data set kept on the GPU, is bound as it
is: it stays the caller's, so nothing may write a bound feed; a captured CUDA
graph copies later feeds into input buffers of its own, ``runtime.cuda_graph``)
and fails on a data var nobody fed; ``forget_feeds`` undoes a failed step's feed, so a
later run that feeds nothing cannot reuse it, and a fed persistable returns to its
old value.
"""

import torch

from ..core.errors import FeedError
from ..core.dtypes import torch_dtype
from ..runtime.boundary import FEED, check_movable, check_value

__all__ = ["check_feed", "to_tensor", "split_batch", "place_feeds", "check_feed_var",
           "bind_feeds", "forget_feeds", "missing_data_error"]


def to_tensor(name, value, var):
    """Convert one feed value for ``var``, raising ``FeedError`` when it does not fit."""
    if isinstance(value, torch.Tensor):
        t = value
    elif hasattr(value, "__array__") and not isinstance(value, (list, tuple)):
        import numpy as np
        t = torch.from_numpy(np.ascontiguousarray(value))
    else:
        try:
            t = torch.tensor(value, dtype=torch_dtype(var.dtype))
        except (TypeError, ValueError) as e:
            raise FeedError(f"feed {name!r}: cannot make a tensor from {type(value).__name__}: "
                            f"{e}") from None
    return check_value(var, t, FEED)


def check_feed(program, feed, required=()):
    """Validate ``feed`` (dict name -> value) against ``program``; return name -> tensor.

    ``required`` names data vars that must be present.
    """
    if feed is None:
        feed = {}
    if not isinstance(feed, dict):
        raise FeedError(f"feed must be a dict of var name -> value, got {type(feed).__name__}")
    block = program.global_block()
    out = {}
    for name, value in feed.items():
        key = name if isinstance(name, str) else getattr(name, "name", name)
        var = block.vars.get(key)
        if var is None:
            data = [v.name for v in program.data_vars()]
            raise FeedError(f"feed {key!r} is not a var of the program; its data vars are "
                            f"{data}")
        out[key] = to_tensor(key, value, var)
    missing = [n for n in required if n not in out]
    if missing:
        var = block.vars[missing[0]]
        raise FeedError(f"data var {missing[0]!r} was not fed (expected shape {var.shape}, "
                        f"dtype {var.dtype})")
    return out


def split_batch(tensor, n, name="feed"):
    """Split ``tensor`` along dim 0 into ``n`` parts as evenly as possible (views)."""
    b = tensor.shape[0]
    if b < n:
        raise FeedError(f"feed {name!r} has batch size {b} but there are {n} places: every "
                        "place needs at least one sample")
    if n == 1:
        return [tensor]  # one place takes the whole batch (a split would only make a view)
    base, extra = divmod(b, n)
    sizes = [base + (1 if i < extra else 0) for i in range(n)]
    return list(torch.split(tensor, sizes))


def check_feed_var(var, allow_persistable_feed):
    """``FeedError`` when ``var`` is persistable and that was not allowed."""
    if var.persistable and not allow_persistable_feed:
        raise FeedError(f"feed {var.name!r} is a persistable var (a parameter or optimizer "
                        "state), not a data var: the step would update the fed tensor in "
                        "place. Pass allow_persistable_feed=True to set it (it is copied "
                        "to every place)")


def place_feeds(program, feed, n, allow_persistable_feed=False):
    """Check ``feed`` and cut it into one dict of tensors per place (module docstring)."""
    block = program.global_block()
    if isinstance(feed, (list, tuple)):
        if len(feed) != n:
            raise FeedError(f"a list feed needs one dict per place: got {len(feed)} for "
                            f"{n} places")
        per_place = [check_feed(program, f) for f in feed]
        for d in per_place:
            for name in d:
                check_feed_var(block.vars[name], allow_persistable_feed)
        return [{k: (t if block.vars[k].is_data else t.detach().clone())
                 for k, t in d.items()} for d in per_place]
    feeds = check_feed(program, feed)
    per_place = [{} for _ in range(n)]
    batch = None  # (name, size) of the first split feed: the others must agree
    for name, t in feeds.items():
        var = block.vars[name]
        check_feed_var(var, allow_persistable_feed)
        if var.persistable:
            # copied, once per place: never the caller's tensor, identical everywhere
            parts = [t.detach().clone() for _ in range(n)]
        elif var.shape and var.shape[0] == -1 and t.dim() > 0:
            if batch is None:
                batch = (name, t.shape[0])
            elif t.shape[0] != batch[1]:
                raise FeedError(f"feeds {batch[0]!r} and {name!r} have batch sizes "
                                f"{batch[1]} and {t.shape[0]}: the split data vars of one "
                                "step must have the same number of samples")
            parts = split_batch(t, n, name)
        else:
            parts = [t if var.is_data else t.detach().clone() for _ in range(n)]
        for d, part in zip(per_place, parts, strict=True):
            d[name] = part
    return per_place


def missing_data_error(var, place=None):
    """The ``FeedError`` for data var ``var`` that nobody fed (on ``place``)."""
    where = f" for place {place}" if place is not None else ""
    return FeedError(f"data var {var.name!r} was not fed{where} (expected shape {var.shape}, "
                     f"dtype {var.dtype})")


def bind_feeds(scopes, places, per_place, data_read):
    """Set each place's feed in its scope, on its device.

    Every var of ``data_read`` must be fed or already set on every place (checked
    before anything is set). Returns what ``forget_feeds`` needs to undo the feed.
    """
    for scope, place, d in zip(scopes, places, per_place, strict=True):
        for v in data_read:
            if v.name not in d and scope.find_var(v.name) is None:
                raise missing_data_error(v, place)
    for place, d in zip(places, per_place, strict=True):
        for name, t in d.items():
            check_movable(name, t, place.device, FEED)
    replaced = []
    for scope, place, d in zip(scopes, places, per_place, strict=True):
        device = place.device
        for name, t in d.items():
            replaced.append((scope, name, scope.vars.get(name)))
            scope.set_var(name, t.to(device, non_blocking=True) if t.device != device else t)
    return replaced


def forget_feeds(program, scopes, per_place, replaced):
    """Undo a failed step's feed: data feeds erased, fed persistables restored."""
    block = program.global_block()
    for scope, d in zip(scopes, per_place, strict=True):
        for name in d:
            if not block.vars[name].persistable:
                scope.erase(name)
    for scope, name, old in replaced:
        if not block.vars[name].persistable:
            continue
        if old is None:
            scope.erase(name)
        else:
            scope.set_var(name, old)
