"""What the benchmark trains: settings -> program, torch twin, optimizer, data.

Policy: every mode trains the same work. The initial weights are the builder's
seeded startup program's (copied into the ``torch.nn`` twin by
``load_from_scope``); the transformer has no builder program, so its twin's own
seeded weights are the initial ones and its program is imported from the twin
with ``from_torch``; so are the ``transformers`` models ``hf-bert`` and ``hf-llama``
(``bench/hf_models.py``, token ids in, built from small configs). The data are one
seeded synthetic batch
(``ssaexec.data.synthetic.random_batch``) of ``places * batch_per_place`` samples;
place (or rank) ``i`` trains samples ``[i * b, (i + 1) * b)``. The torch
optimizer is the one whose update matches ``ssaexec.program.example_models.make_optimizer``.

The twins live in the source tree (``bench/torch_models.py``), not in the
installed package: ``load_twins`` imports them from there.
"""

import sys
from pathlib import Path

__all__ = ["repo_root", "load_twins", "build_program", "build_twin", "initial_twin",
           "from_torch_program", "torch_optimizer", "synthetic_batch", "place_samples",
           "title_size"]


def repo_root():
    """The ssaexec source tree (where ``bench/torch_models.py`` lives)."""
    return Path(__file__).resolve().parents[2]


# models with no builder program: imported from their seeded twin with from_torch
IMPORTED = ("transformer", "hf-bert", "hf-llama")


def load_twins(stem="torch_models"):
    """Import ``bench/torch_models.py`` (the torch.nn twins; ``stem="hf_models"``: the
    transformers models) from the source tree."""
    import importlib.util
    path = repo_root() / "bench" / f"{stem}.py"
    if f"ssaexec_bench_{stem}" in sys.modules:
        return sys.modules[f"ssaexec_bench_{stem}"]
    if not path.exists():
        raise RuntimeError(f"the torch twins are not at {path}: the benchmark needs the ssaexec "
                           f"source tree (bench/{stem}.py), not only the installed package")
    spec = importlib.util.spec_from_file_location(f"ssaexec_bench_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def model_kwargs(s):
    """Builder kwargs and twin kwargs for the settings dict ``s`` (checks the model name)."""
    name = s["model"]
    if name == "mlp":
        hidden = tuple(int(h) for h in str(s["hidden"]).split(",") if h)
        kw = dict(in_dim=s["in_dim"], hidden=hidden, classes=s["classes"])
        return kw, dict(kw)
    if name == "transformer":
        kw = dict(d_model=s["d_model"], heads=s["heads"], layers=s["layers"],
                  classes=s["classes"])
        return kw, dict(kw)
    if name in ("hf-bert", "hf-llama"):
        kw = dict(d_model=s["d_model"], heads=s["heads"], layers=s["layers"],
                  classes=s["classes"], vocab=s["vocab"], seq_len=s["seq_len"])
        return kw, dict(kw)
    for prefix in ("resnext", "resnet"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            depth = int(name[len(prefix):])
            kw = dict(image_size=s["image_size"], classes=s["classes"], base=s["base"])
            if prefix == "resnext":
                kw.update(cardinality=s["cardinality"], width=s["width"])
            return dict(kw, depth=depth), dict(kw)
    raise ValueError(f"unknown model {name!r}: use mlp, transformer, resnet18/34/50/101/152, "
                     "resnext50/101/152, hf-bert or hf-llama")


def build_program(s):
    """``(main, startup, loss_name)`` of the benchmark model for settings ``s``."""
    from ..program import example_models as models
    opt = models.make_optimizer(s["optimizer"], s["lr"])
    kw, _ = model_kwargs(s)
    if s["model"] in IMPORTED:
        # no builder version: import the seeded twin, its forward returning the loss, so
        # the feeds keep the builder's names (img, label)
        from ..frontends.torch import from_torch
        x, y = synthetic_batch(s, 2)
        return from_torch(load_twins().WithLoss(build_twin(s)), {"img": x, "label": y},
                          optimizer=opt, random_seed=s["seed"])
    if s["model"] == "mlp":
        return models.build_mlp(optimizer=opt, seed=s["seed"], **kw)
    return models.build_resnet(optimizer=opt, seed=s["seed"], **kw)


def build_twin(s):
    """The ``torch.nn`` twin of ``build_program(s)``."""
    _, kw = model_kwargs(s)
    if s["model"] in IMPORTED:
        import torch
        # torch-only model: its seeded initialisation is the initial weights of every mode
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s["seed"])
            if s["model"] != "transformer":
                return load_twins("hf_models").build_hf(s["model"], **kw)
            return load_twins().build_twin(s["model"], **kw)
    return load_twins().build_twin(s["model"], **kw)


def initial_twin(s):
    """The twin holding the initial weights of every mode.

    For builder models the seeded startup program's, copied by ``load_from_scope``;
    the transformer's own seeded ones (its program is imported from them).
    """
    twin = build_twin(s)
    if s["model"] not in IMPORTED:
        import ssaexec as se
        main, startup, _ = build_program(s)
        scope = se.Scope()
        se.Executor(se.CPUPlace()).run(startup, scope=scope)
        load_twins().load_from_scope(twin, main, scope)
    return twin


def from_torch_program(s, x, y):
    """``(main, startup, loss, feed names)``: the initial twin converted by ``from_torch``.

    The feed vars are the forward's argument (``x``) and ``target``, as
    ``from_torch`` names them; ``x``, ``y`` are example inputs (at least 2 samples).
    """
    try:
        from ..frontends.torch import from_torch
    except ImportError as e:
        raise RuntimeError(f"--from-torch needs ssaexec.frontends.torch.from_torch, which "
                           f"could not be imported: {e}") from e
    from ..program import example_models as models
    twin = initial_twin(s)
    b = max(2, s["batch_per_place"])
    main, startup, loss = from_torch(twin, {"x": x[:b], "target": y[:b]},
                                     loss_fn=load_twins().loss_fn,
                                     optimizer=models.make_optimizer(s["optimizer"], s["lr"]))
    return main, startup, loss, ("x", "target")


def torch_optimizer(name, params, lr):
    """The ``torch.optim`` optimizer whose update matches ``make_optimizer(name, lr)``."""
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"no torch optimizer for {name!r}")


def synthetic_batch(s, n):
    """``n`` seeded samples: (images or features, int64 labels [n, 1]); token ids
    ``[n, seq_len]`` and labels ``[n, 1]`` (``hf-bert``) or ``[n, seq_len]`` (``hf-llama``)."""
    from ..data.synthetic import random_batch
    if s["model"] in ("hf-bert", "hf-llama"):
        import torch
        g = torch.Generator().manual_seed(1000 + s["seed"])
        ids = torch.randint(0, s["vocab"], (n, s["seq_len"]), generator=g)
        if s["model"] == "hf-bert":
            return ids, torch.randint(0, s["classes"], (n, 1), generator=g)
        return ids, torch.randint(0, s["vocab"], (n, s["seq_len"]), generator=g)
    shape = ([s["in_dim"]] if s["model"] == "mlp" else
             [s["seq_len"], s["d_model"]] if s["model"] == "transformer" else
             [3, s["image_size"], s["image_size"]])
    return random_batch(shape, n, s["classes"], 1000 + s["seed"])


def place_samples(s, places, first=0, count=1):
    """The samples of places ``first .. first + count - 1`` in the batch of ``places`` places."""
    b = s["batch_per_place"]
    x, y = synthetic_batch(s, places * b)
    return x[first * b:(first + count) * b], y[first * b:(first + count) * b]


def title_size(s):
    """The input size for titles: `` 32x32`` (images), `` 2x32 h2 seq 16`` (transformer)."""
    if s["model"] == "mlp":
        return ""
    if s["model"] == "transformer":
        return f" {s['layers']}x{s['d_model']} h{s['heads']} seq {s['seq_len']}"
    if s["model"] in ("hf-bert", "hf-llama"):
        return f" {s['layers']}x{s['d_model']} h{s['heads']} seq {s['seq_len']} vocab {s['vocab']}"
    return f" {s['image_size']}x{s['image_size']}"
