"""``torch.nn`` twins of the builder's example models (``ssaexec.program.example_models``), for the benchmark.

Each twin has the same architecture as its ssaexec program and registers its
parameters in the order the builder creates them, so ``load_from_scope`` can
copy a program's initial weights into it one to one:

* ``conv_bn`` (``ssaexec.program.example_models._conv_bn``) creates conv weight, BN scale, BN
  bias; the BN running mean/variance are persistable non-parameters
  (``<bn>.w_1`` / ``<bn>.w_2``) and are copied into the BN buffers.
* a residual block creates its two (basic) or three (bottleneck) main
  ``conv_bn``s first and the projection shortcut's ``conv_bn`` last.
* ``fc`` creates weight ``[in, out]`` (transposed into ``nn.Linear``'s
  ``[out, in]``) then bias.

BN momentum follows Paddle (running = 0.9 * running + 0.1 * batch), which is
torch's ``momentum=0.1``. The loss is softmax cross entropy averaged over the
batch (``F.cross_entropy``), labels shaped ``[N, 1]`` as the programs feed them.

``Transformer`` has no builder program: the benchmark imports it with
``se.from_torch`` (wrapped in ``WithLoss``, so the feeds are named ``img`` and
``label`` like the builder's), and every mode starts from the same seeded
initial weights instead of the builder's.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLP", "ResNet", "Transformer", "WithLoss", "build_twin", "load_from_scope",
           "loss_fn"]

_RESNET_BLOCKS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
                  50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
                  152: ("bottleneck", [3, 8, 36, 3])}


class MLP(nn.Module):
    """``ssaexec.program.example_models.build_mlp``: fc-relu layers, then an fc to the logits."""

    def __init__(self, in_dim=784, hidden=(128, 64), classes=10):
        super().__init__()
        dims = [in_dim, *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.out = nn.Linear(dims[-1], classes)

    def forward(self, x):
        for lin in self.hidden:
            x = torch.relu(lin(x))
        return self.out(x)


class ConvBN(nn.Module):
    """conv (no bias) + batch norm (+ relu): ``ssaexec.program.example_models._conv_bn``."""

    def __init__(self, c_in, c_out, k, stride=1, groups=1, relu=True):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-5, momentum=0.1)
        self.relu = relu

    def forward(self, x):
        x = self.bn(self.conv(x))
        return torch.relu(x) if self.relu else x


class BasicBlock(nn.Module):
    def __init__(self, c_in, filters, stride, cardinality, width):
        super().__init__()
        self.a = ConvBN(c_in, filters, 3, stride)
        self.b = ConvBN(filters, filters, 3, relu=False)
        # registered after the main path: the builder creates the shortcut last
        self.shortcut = (ConvBN(c_in, filters, 1, stride, relu=False)
                         if c_in != filters or stride != 1 else None)
        self.out_channels = filters

    def forward(self, x):
        s = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(self.b(self.a(x)) + s)


class Bottleneck(nn.Module):
    def __init__(self, c_in, filters, stride, cardinality, width):
        super().__init__()
        inner = filters if cardinality == 1 else cardinality * width * filters // 64
        self.a = ConvBN(c_in, inner, 1)
        self.b = ConvBN(inner, inner, 3, stride, groups=cardinality)
        self.c = ConvBN(inner, filters * 4, 1, relu=False)
        self.shortcut = (ConvBN(c_in, filters * 4, 1, stride, relu=False)
                         if c_in != filters * 4 or stride != 1 else None)
        self.out_channels = filters * 4

    def forward(self, x):
        s = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(self.c(self.b(self.a(x))) + s)


class ResNet(nn.Module):
    """``ssaexec.program.example_models.build_resnet``: CIFAR stem for images <= 64 px, ImageNet stem above."""

    def __init__(self, depth=18, image_size=32, classes=10, cardinality=1, width=4, base=64):
        super().__init__()
        kind, counts = _RESNET_BLOCKS[depth]
        block = BasicBlock if kind == "basic" else Bottleneck
        if image_size <= 64:
            self.stem = ConvBN(3, base, 3)
            self.pool = None
        else:
            self.stem = ConvBN(3, base, 7, stride=2)
            self.pool = nn.MaxPool2d(3, 2, 1)
        blocks, c = [], base
        for stage, n in enumerate(counts):
            filters = base * (2 ** stage)
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                b = block(c, filters, stride, cardinality, width)
                blocks.append(b)
                c = b.out_channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        if self.pool is not None:
            x = self.pool(x)
        x = self.blocks(x)
        return self.fc(x.mean(dim=(2, 3)))


class Transformer(nn.Module):
    """A small encoder-only transformer classifier: issue 13's launch-bound model.

    Input ``[N, seq, d_model]`` features; ``layers`` post-norm
    ``nn.TransformerEncoderLayer`` (``heads`` heads, ReLU feed-forward of
    ``4 * d_model``, dropout off so every mode computes the same numbers), the
    mean over the sequence, then a linear head to ``classes`` logits. With the
    defaults (2 layers, d_model 32) a training step is ~300 tiny ATen ops.
    """

    def __init__(self, d_model=32, heads=2, layers=2, classes=10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                           batch_first=True)
        # no nested-tensor fast path: it only applies in eval mode and warns otherwise
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class WithLoss(nn.Module):
    """``loss_fn(model(img), label)`` as a module, the form ``se.from_torch`` imports.

    Its forward returns the loss, so the imported program's feeds are ``img`` and
    ``label``, the names the builder's programs use.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, img, label):
        return loss_fn(self.model(img), label)


def build_twin(name, **kw):
    """The twin of ``ssaexec.program.example_models.build_model(name, **kw)`` (model kwargs only)."""
    kw = {k: v for k, v in kw.items() if k not in ("dtype", "optimizer", "seed")}
    if name == "mlp":
        return MLP(**kw)
    if name == "transformer":
        return Transformer(**kw)
    if name.startswith("resnext"):
        return ResNet(int(name[len("resnext"):]), cardinality=kw.pop("cardinality", 32),
                      width=kw.pop("width", 4), **kw)
    if name.startswith("resnet"):
        return ResNet(int(name[len("resnet"):]), **kw)
    raise ValueError(f"no torch twin for model {name!r}: use mlp, transformer, resnetN or "
                     "resnextN")


def loss_fn(logits, label):
    """Mean softmax cross entropy; ``label`` is ``[N, 1]`` (or ``[N]``) int64."""
    return F.cross_entropy(logits, label.reshape(-1))


def load_from_scope(model, program, scope):
    """Copy ``program``'s parameters (creation order) from ``scope`` into ``model``.

    BN running statistics are copied too (the persistables named after the BN
    scale's prefix). Returns the list of (ssaexec name, torch parameter) pairs.
    """
    params = list(program.all_parameters())
    torch_params = list(model.named_parameters())
    if len(params) != len(torch_params):
        raise ValueError(f"{type(model).__name__} has {len(torch_params)} parameters but the "
                         f"program has {len(params)}: the twin does not match the program")
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    pairs = []
    with torch.no_grad():
        for p, (tname, tp) in zip(params, torch_params, strict=True):
            v = scope.find_var(p.name)
            if v is None:
                raise ValueError(f"parameter {p.name!r} has no value: run the startup program")
            if tp.dim() == 2 and tuple(v.shape) != tuple(tp.shape):
                v = v.t()
            if tuple(v.shape) != tuple(tp.shape):
                raise ValueError(f"shape mismatch: {p.name} {list(v.shape)} vs torch {tname} "
                                 f"{list(tp.shape)}")
            tp.copy_(v)
            pairs.append((p.name, tp))
            m = owner[id(tp)]
            if isinstance(m, nn.BatchNorm2d) and tp is m.weight:
                prefix = p.name.rsplit(".", 1)[0]
                for buf, suffix in ((m.running_mean, "w_1"), (m.running_var, "w_2")):
                    s = scope.find_var(f"{prefix}.{suffix}")
                    if s is not None:
                        buf.copy_(s)
    return pairs
