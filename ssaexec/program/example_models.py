"""Example models built with the builder API.

Each ``build_*`` function returns ``(main, startup, loss_name)`` for a training
program (forward, backward and optimizer). Used by the demo, the CLI examples,
the tests and the benchmark harness, so everyone trains the same models.
"""

from . import layers as L
from . import optimizer as opt
from .backward import append_backward
from .builder import program_guard
from .desc import Program

__all__ = ["build_uci_housing", "build_seed_mlp", "build_mlp", "build_cnn", "build_resnet",
           "build_bert", "make_optimizer", "MODELS", "build_model"]


def make_optimizer(name="sgd", learning_rate=0.01, **kw):
    """An optimizer by name: sgd, momentum, nesterov, adam or adamw."""
    name = name.lower()
    if name == "sgd":
        return opt.SGD(learning_rate, **kw)
    if name == "momentum":
        return opt.Momentum(learning_rate, **kw)
    if name == "nesterov":
        return opt.Momentum(learning_rate, use_nesterov=True, **kw)
    if name == "adam":
        return opt.Adam(learning_rate, **kw)
    if name == "adamw":
        return opt.AdamW(learning_rate, **kw)
    raise ValueError(f"unknown optimizer {name!r}: use sgd, momentum, nesterov, adam or adamw")


def _finish(main, startup, loss, optimizer):
    with program_guard(main, startup):
        (optimizer or opt.SGD(0.01)).minimize(loss)
    return main, startup, loss.name


def _uci_housing(main, startup, dtype):
    with program_guard(main, startup):
        x = L.data("x", [-1, 13], dtype)
        y = L.data("y", [-1, 1], dtype)
        return L.mean(L.square_error_cost(L.fc(x, 1), y))


def build_uci_housing(dtype="float32", optimizer=None, seed=0):
    """The uci_housing linear regression: fc(13 -> 1) with squared error."""
    main, startup = Program(seed), Program(seed)
    loss = _uci_housing(main, startup, dtype)
    return _finish(main, startup, loss, optimizer)


def build_uci_housing_pserver(dtype="float32", optimizer=None, seed=0):
    """Seed 002's example: uci_housing with its optimizer in a PlaceableBlock (for
    ``se.transpile`` / ``ssaexec launch``; run as it is, it trains as uci_housing)."""
    main, startup = Program(seed), Program(seed)
    loss = _uci_housing(main, startup, dtype)
    with program_guard(main, startup):
        params_grads = append_backward(loss)
        with L.PlaceableBlock(inputs=params_grads, outputs=[p for p, _ in params_grads]):
            (optimizer or opt.SGD(0.01)).apply_gradients(params_grads)
    return main, startup, loss.name


def build_seed_mlp(dtype="float32", optimizer=None, seed=0, in_dim=784, hidden=100,
                   classes=10):
    """The seed document's program: softmax(fc(fc(x))) with cross entropy, SGD."""
    main, startup = Program(seed), Program(seed)
    with program_guard(main, startup):
        x = L.data("x", [-1, in_dim], dtype)
        label = L.data("label", [-1, 1], "int64")
        h = L.fc(x, hidden)
        prob = L.fc(h, classes, act="softmax")
        loss = L.mean(L.cross_entropy(prob, label))
    return _finish(main, startup, loss, optimizer)


def build_mlp(dtype="float32", optimizer=None, seed=0, in_dim=784, hidden=(128, 64),
              classes=10):
    """An MLP on MNIST-shaped data: fc-relu layers and softmax cross entropy."""
    main, startup = Program(seed), Program(seed)
    with program_guard(main, startup):
        x = L.data("img", [-1, in_dim], dtype)
        label = L.data("label", [-1, 1], "int64")
        h = x
        for size in hidden:
            h = L.fc(h, size, act="relu")
        logits = L.fc(h, classes)
        loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    return _finish(main, startup, loss, optimizer)


def build_cnn(dtype="float32", optimizer=None, seed=0, channels=1, size=28, classes=10,
              filters=(8, 16), batch_norm=True):
    """A small CNN: [conv-bn-relu-pool] x len(filters), then fc; MNIST-shaped by default."""
    main, startup = Program(seed), Program(seed)
    with program_guard(main, startup):
        x = L.data("img", [-1, channels, size, size], dtype)
        label = L.data("label", [-1, 1], "int64")
        h = x
        for f in filters:
            h = L.conv2d(h, f, 3, padding=1, bias_attr=not batch_norm)
            if batch_norm:
                h = L.batch_norm(h)
            h = L.relu(h)
            h = L.pool2d(h, 2, "max", pool_stride=2)
        logits = L.fc(h, classes)
        loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    return _finish(main, startup, loss, optimizer)


_RESNET_BLOCKS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
                  50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
                  152: ("bottleneck", [3, 8, 36, 3])}


def _conv_bn(x, filters, k, stride=1, groups=1, act="relu"):
    h = L.conv2d(x, filters, k, stride=stride, padding=(k - 1) // 2, groups=groups,
                 bias_attr=False)
    return L.batch_norm(h, act=act)


def _shortcut(x, filters, stride):
    if x.shape[1] != filters or stride != 1:
        return _conv_bn(x, filters, 1, stride, act=None)
    return x


def _basic_block(x, filters, stride, cardinality, width):
    h = _conv_bn(x, filters, 3, stride)
    h = _conv_bn(h, filters, 3, act=None)
    return L.elementwise_add(h, _shortcut(x, filters, stride), act="relu")


def _bottleneck(x, filters, stride, cardinality, width):
    inner = filters if cardinality == 1 else cardinality * width * filters // 64
    h = _conv_bn(x, inner, 1)
    h = _conv_bn(h, inner, 3, stride, groups=cardinality)
    h = _conv_bn(h, filters * 4, 1, act=None)
    return L.elementwise_add(h, _shortcut(x, filters * 4, stride), act="relu")


def build_resnet(depth=18, image_size=32, classes=10, dtype="float32", optimizer=None, seed=0,
                 cardinality=1, width=4, base=64):
    """ResNet (depth 18/34/50/101/152) or ResNeXt (``cardinality`` > 1, bottleneck only).

    ``image_size`` 32 uses the CIFAR stem (3x3 conv, no pooling); larger sizes
    use the ImageNet stem (7x7 stride-2 conv and 3x3 max pool).
    """
    if depth not in _RESNET_BLOCKS:
        raise ValueError(f"depth must be one of {sorted(_RESNET_BLOCKS)}, got {depth}")
    block_type, counts = _RESNET_BLOCKS[depth]
    if cardinality > 1 and block_type != "bottleneck":
        raise ValueError("ResNeXt needs a bottleneck depth (50, 101, 152)")
    block = _basic_block if block_type == "basic" else _bottleneck
    main, startup = Program(seed), Program(seed)
    with program_guard(main, startup):
        x = L.data("img", [-1, 3, image_size, image_size], dtype)
        label = L.data("label", [-1, 1], "int64")
        if image_size <= 64:
            h = _conv_bn(x, base, 3)
        else:
            h = _conv_bn(x, base, 7, stride=2)
            h = L.pool2d(h, 3, "max", pool_stride=2, pool_padding=1)
        for stage, n in enumerate(counts):
            filters = base * (2 ** stage)
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                h = block(h, filters, stride, cardinality, width)
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        logits = L.fc(h, classes)
        loss = L.mean(L.softmax_with_cross_entropy(logits, label))
    return _finish(main, startup, loss, optimizer)


def _attention(x, hidden, heads, dropout):
    def split_heads(t):  # [B, S, H] -> [B, heads, S, H / heads]
        return L.transpose(L.reshape(t, [0, 0, heads, hidden // heads]), [0, 2, 1, 3])
    q, k, v = (split_heads(L.fc(x, hidden, num_flatten_dims=2)) for _ in range(3))
    scores = L.matmul(q, k, transpose_y=True, alpha=(hidden // heads) ** -0.5)
    p = L.dropout(L.softmax(scores), dropout)
    ctx = L.reshape(L.transpose(L.matmul(p, v), [0, 2, 1, 3]), [0, 0, hidden])
    return L.dropout(L.fc(ctx, hidden, num_flatten_dims=2), dropout)


def build_bert(layers=24, hidden=1024, heads=16, seq_len=128, vocab=30528, masked=20,
               dtype="float32", optimizer=None, seed=0, dropout=0.1):
    """BERT pre-training (BERT-Large by default): an encoder with a masked-LM and a
    next-sentence head.

    The masked-LM head runs on ``masked`` positions per sequence (BERT's
    ``max_predictions_per_seq``: 20 at sequence length 128, 80 at 512), taken as the
    first ones (a ``split``; the real model gathers them: the same sizes and cost),
    with the decoder tied to the word embedding. Used by the simulator's validation
    against published BERT throughput (docs/simulator.md).
    """
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    if not 0 < masked < seq_len:
        raise ValueError(f"masked must be in (0, seq_len), got {masked}")
    main, startup = Program(seed), Program(seed)
    with program_guard(main, startup):
        ids = L.data("input_ids", [-1, seq_len], "int64")
        types = L.data("token_type_ids", [-1, seq_len], "int64")
        pos = L.data("position_ids", [-1, seq_len], "int64")
        mlm_label = L.data("masked_lm_labels", [-1, masked, 1], "int64")
        nsp_label = L.data("next_sentence_labels", [-1, 1], "int64")
        words = L.embedding(ids, [vocab, hidden], name="word_embedding", dtype=dtype)
        h = L.elementwise_add(L.elementwise_add(
            words, L.embedding(pos, [512, hidden], name="position_embedding", dtype=dtype)),
            L.embedding(types, [2, hidden], name="type_embedding", dtype=dtype))
        h = L.dropout(L.layer_norm(h, begin_norm_axis=2), dropout)
        for _ in range(layers):
            h = L.layer_norm(L.elementwise_add(h, _attention(h, hidden, heads, dropout)),
                             begin_norm_axis=2)
            ffn = L.fc(L.fc(h, 4 * hidden, num_flatten_dims=2, act="gelu"), hidden,
                       num_flatten_dims=2)
            h = L.layer_norm(L.elementwise_add(h, L.dropout(ffn, dropout)), begin_norm_axis=2)
        cls, _ = L.split(h, [1, seq_len - 1], dim=1)
        pooled = L.fc(L.reshape(cls, [0, hidden]), hidden, act="tanh")
        nsp = L.mean(L.softmax_with_cross_entropy(L.fc(pooled, 2), nsp_label))
        picked, _ = L.split(h, [masked, seq_len - masked], dim=1)
        t = L.layer_norm(L.fc(picked, hidden, num_flatten_dims=2, act="gelu"),
                         begin_norm_axis=2)
        logits = L.matmul(t, main.global_block().var("word_embedding.w_0"), transpose_y=True)
        mlm = L.mean(L.softmax_with_cross_entropy(logits, mlm_label))
        loss = L.elementwise_add(mlm, nsp)
    return _finish(main, startup, loss, optimizer)


MODELS = {
    "uci_housing": build_uci_housing,
    "seed_mlp": build_seed_mlp,
    "mlp": build_mlp,
    "cnn": build_cnn,
    "resnet18": lambda **kw: build_resnet(18, **kw),
    "resnet50": lambda **kw: build_resnet(50, **kw),
    "resnext50": lambda **kw: build_resnet(50, cardinality=32, width=4, **kw),
    "bert-large": build_bert,
    "bert-base": lambda **kw: build_bert(**dict(dict(layers=12, hidden=768, heads=12), **kw)),
}


def build_model(name, **kw):
    """Build a model from ``MODELS`` by name."""
    try:
        return MODELS[name](**kw)
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}") from None
