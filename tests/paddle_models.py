"""Paddle programs written without Paddle, for tests/frontends/paddle/test_paddle_import.py.

``ProgramBuilder`` writes ProgramDesc messages with the message classes of our own
``framework.proto``; ``mlp()``, ``cnn()`` and ``cnn_inference()`` lay out the ops the
way Paddle 2.x's static graph does (``paddle.static.nn.fc``/``conv2d``/``batch_norm``,
``append_backward``, the optimizers' update ops, ``save_inference_model``'s feed and
fetch ops): the same op types, slots, attribute names and encodings, ``op_role`` and
``op_role_var``, gradient names (``@GRAD``, ``@EMPTY@``) and startup programs.

Each returns a ``Model``: the main and startup programs' bytes, the parameter values
(a dict, in the order Paddle's ``save_combine`` writes them: sorted by name) and the
matching PyTorch computation for the numerics checks.
"""

import numpy as np
import torch
import torch.nn.functional as F

from ssaexec.frontends.paddle.schema import messages

FP32, INT64, LOD_TENSOR, FEED_MINIBATCH, FETCH_LIST = 5, 3, 7, 9, 10
FORWARD, BACKWARD, OPTIMIZE, LOSS = 0, 1, 2, 256
EMPTY = "@EMPTY@"

# AttrType codes
A_INT, A_FLOAT, A_STRING, A_INTS, A_FLOATS, A_STRINGS, A_BOOLEAN = 0, 1, 2, 3, 4, 5, 6
A_LONG, A_LONGS = 9, 11


def longs(values):
    """Mark an attribute value as LONGS (Paddle's ``std::vector<int64_t>`` attrs)."""
    return ("longs", list(values))


def long(value):
    return ("long", int(value))


class ProgramBuilder:
    """Writes one block of a Paddle ProgramDesc."""

    def __init__(self, version=None):
        self.msg = messages().ProgramDesc()
        self.block = self.msg.blocks.add(idx=0, parent_idx=-1)
        if version is not None:
            self.msg.version.version = version

    def var(self, name, shape, dtype=FP32, persistable=False, is_parameter=False,
            stop_gradient=False, need_check_feed=False, kind=LOD_TENSOR):
        v = self.block.vars.add(name=name, persistable=persistable, is_parameter=is_parameter,
                                stop_gradient=stop_gradient, need_check_feed=need_check_feed)
        v.type.type = kind
        if kind == LOD_TENSOR:
            v.type.lod_tensor.tensor.data_type = dtype
            v.type.lod_tensor.tensor.dims.extend(shape)
        return name

    def op(self, type, inputs=None, outputs=None, attrs=None, role=FORWARD, role_var=None):
        o = self.block.ops.add(type=type)
        for slot, names in (inputs or {}).items():
            o.inputs.add(parameter=slot, arguments=list(names))
        for slot, names in (outputs or {}).items():
            o.outputs.add(parameter=slot, arguments=list(names))
        attrs = dict(attrs or {})
        attrs["op_role"] = role
        attrs["op_role_var"] = list(role_var or [])
        attrs["op_namescope"] = "/"
        attrs["op_callstack"] = ["  File \"train.py\", line 1, in <module>"]
        attrs["use_mkldnn"] = False
        for name, value in attrs.items():
            _set_attr(o.attrs.add(name=name), value)
        return o

    def bytes(self):
        return self.msg.SerializeToString()


def _set_attr(a, value):
    if isinstance(value, tuple) and value[0] == "longs":
        a.type, a.longs[:] = A_LONGS, value[1]
    elif isinstance(value, tuple) and value[0] == "long":
        a.type, a.l = A_LONG, value[1]
    elif isinstance(value, bool):
        a.type, a.b = A_BOOLEAN, value
    elif isinstance(value, int):
        a.type, a.i = A_INT, value
    elif isinstance(value, float):
        a.type, a.f = A_FLOAT, value
    elif isinstance(value, str):
        a.type, a.s = A_STRING, value
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        a.type = A_STRINGS
        a.strings.extend(value)
    elif isinstance(value, list) and all(isinstance(v, int) for v in value):
        a.type = A_INTS
        a.ints.extend(value)
    elif isinstance(value, list):
        a.type = A_FLOATS
        a.floats.extend(value)
    else:  # pragma: no cover - a test bug
        raise TypeError(value)


class Model:
    def __init__(self, main, startup, params, feed, fetch, loss=None):
        self.main, self.startup, self.params = main, startup, params
        self.feed, self.fetch, self.loss = feed, fetch, loss


def _g(name):
    return name + "@GRAD"


class _Net:
    """Forward and backward ops of a small Paddle network, recorded as they are built."""

    def __init__(self, b, startup, rng):
        self.b, self.s, self.rng = b, startup, rng
        self.params = {}
        self.backward = []   # callables, replayed in reverse
        self.counts = {}

    def name(self, prefix):
        k = self.counts.get(prefix, 0)
        self.counts[prefix] = k + 1
        return f"{prefix}_{k}"

    def param(self, name, shape, value):
        for builder in (self.b, self.s):
            builder.var(name, shape, persistable=True, is_parameter=True)
        self.params[name] = value.astype(np.float32)
        # the startup initialiser Paddle would write (values come from params in the tests)
        if len(shape) > 1:
            self.s.op("uniform_random", outputs={"Out": [name]},
                      attrs={"shape": longs(shape), "min": -0.5, "max": 0.5, "seed": 0,
                             "dtype": FP32, "diag_num": 0, "diag_step": 0, "diag_val": 1.0})
        else:
            self.s.op("fill_constant", outputs={"Out": [name]},
                      attrs={"shape": longs(shape), "value": 0.0, "dtype": FP32,
                             "str_value": "0.0", "force_cpu": False})
        return name

    def tmp(self, prefix, shape, dtype=FP32, stop_gradient=False):
        return self.b.var(f"{prefix}.tmp_{self._tmpk(prefix)}", shape, dtype,
                          stop_gradient=stop_gradient)

    def _tmpk(self, prefix):
        k = self.counts.get(prefix + ".tmp", 0)
        self.counts[prefix + ".tmp"] = k + 1
        return k

    def grad_var(self, name, shape):
        g = _g(name)
        if not any(v.name == g for v in self.b.block.vars):
            self.b.var(g, shape)
        return g

    def fc(self, x, x_shape, size, act=None, w=None, bias=None):
        prefix = self.name("fc")
        in_dim = int(np.prod(x_shape[1:]))
        w = self.param(f"{prefix}.w_0", [in_dim, size], w)
        bname = self.param(f"{prefix}.b_0", [size], bias)
        out0 = self.tmp(prefix, [-1, size])
        self.b.op("mul", {"X": [x], "Y": [w]}, {"Out": [out0]},
                  {"x_num_col_dims": 1, "y_num_col_dims": 1})
        out1 = self.tmp(prefix, [-1, size])
        self.b.op("elementwise_add", {"X": [out0], "Y": [bname]}, {"Out": [out1]},
                  {"axis": 1})

        def back_mul(x=x, w=w, out0=out0, x_shape=x_shape):
            gx = EMPTY if x in self.data else self.grad_var(x, x_shape)
            self.b.op("mul_grad", {"X": [x], "Y": [w], "Out@GRAD": [_g(out0)]},
                      {"X@GRAD": [gx], "Y@GRAD": [self.grad_var(w, [in_dim, size])]},
                      {"x_num_col_dims": 1, "y_num_col_dims": 1}, role=BACKWARD,
                      role_var=[w, _g(w)])

        def back_add(out0=out0, bname=bname, out1=out1):
            self.b.op("elementwise_add_grad",
                      {"X": [out0], "Y": [bname], "Out@GRAD": [_g(out1)]},
                      {"X@GRAD": [self.grad_var(out0, [-1, size])],
                       "Y@GRAD": [self.grad_var(bname, [size])]}, {"axis": 1},
                      role=BACKWARD, role_var=[bname, _g(bname)])

        self.backward += [back_mul, back_add]
        if act is None:
            return out1
        out2 = self.tmp(prefix, [-1, size])
        self.b.op(act, {"X": [out1]}, {"Out": [out2]})

        def back_act(out1=out1, out2=out2):
            self.b.op(act + "_grad", {"Out": [out2], "Out@GRAD": [_g(out2)]},
                      {"X@GRAD": [self.grad_var(out1, [-1, size])]}, role=BACKWARD)
        self.backward.append(back_act)
        return out2

    def emit_backward(self):
        for fn in reversed(self.backward):
            fn()


def _optimizer(net, kind, lr, shapes, hyper):
    """Paddle's update ops (main) and accumulators (startup) for every parameter."""
    b, s = net.b, net.s
    lr_name = "learning_rate_0"
    for builder in (b, s):
        builder.var(lr_name, [1], persistable=True)
    s.op("fill_constant", outputs={"Out": [lr_name]},
         attrs={"shape": longs([1]), "value": float(lr), "dtype": FP32,
                "str_value": str(float(lr)), "force_cpu": False})
    state = {lr_name: np.array([lr], dtype=np.float32)}
    for k, (p, shape) in enumerate(shapes.items()):
        g = _g(p)
        role_var = [p, g]
        if kind == "sgd":
            b.op("sgd", {"Param": [p], "Grad": [g], "LearningRate": [lr_name]},
                 {"ParamOut": [p]}, {"multi_precision": False}, role=OPTIMIZE, role_var=role_var)
        elif kind == "momentum":
            v = f"{p}_velocity_0"
            for builder in (b, s):
                builder.var(v, shape, persistable=True)
            s.op("fill_constant", outputs={"Out": [v]},
                 attrs={"shape": longs(shape), "value": 0.0, "dtype": FP32})
            state[v] = np.zeros(shape, np.float32)
            b.op("momentum", {"Param": [p], "Grad": [g], "Velocity": [v],
                              "LearningRate": [lr_name]},
                 {"ParamOut": [p], "VelocityOut": [v]},
                 {"mu": hyper["mu"], "use_nesterov": False, "regularization_method": "",
                  "regularization_coeff": 0.0, "multi_precision": False, "rescale_grad": 1.0},
                 role=OPTIMIZE, role_var=role_var)
        else:
            m1, m2 = f"{p}_moment1_0", f"{p}_moment2_0"
            b1, b2 = f"{p}_beta1_pow_acc_0", f"{p}_beta2_pow_acc_0"
            for builder in (b, s):
                builder.var(m1, shape, persistable=True)
                builder.var(m2, shape, persistable=True)
                builder.var(b1, [1], persistable=True)
                builder.var(b2, [1], persistable=True)
            for name, shp, value in ((m1, shape, 0.0), (m2, shape, 0.0),
                                     (b1, [1], hyper["beta1"]), (b2, [1], hyper["beta2"])):
                s.op("fill_constant", outputs={"Out": [name]},
                     attrs={"shape": longs(shp), "value": float(value), "dtype": FP32})
                state[name] = np.full(shp, value, np.float32)
            b.op("adam", {"Param": [p], "Grad": [g], "LearningRate": [lr_name],
                          "Moment1": [m1], "Moment2": [m2], "Beta1Pow": [b1], "Beta2Pow": [b2]},
                 {"ParamOut": [p], "Moment1Out": [m1], "Moment2Out": [m2],
                  "Beta1PowOut": [b1], "Beta2PowOut": [b2]},
                 {"beta1": hyper["beta1"], "beta2": hyper["beta2"],
                  "epsilon": hyper["epsilon"], "lazy_mode": False,
                  "min_row_size_to_use_multithread": long(1000), "multi_precision": False,
                  "use_global_beta_pow": False}, role=OPTIMIZE, role_var=role_var)
    return state


def _seed_loss(b, loss, shape):
    b.var(_g(loss), shape)
    b.op("fill_constant", outputs={"Out": [_g(loss)]},
         attrs={"shape": longs(shape), "value": 1.0, "dtype": FP32, "force_cpu": False},
         role=BACKWARD | LOSS)


def mlp(optimizer="momentum", scalar_loss=True, seed=0, sizes=(8, 16, 4)):
    """An MNIST-style MLP (fc-relu-fc, softmax cross entropy, mean) with its backward."""
    rng = np.random.default_rng(seed)
    b, s = ProgramBuilder(), ProgramBuilder()
    net = _Net(b, s, rng)
    d_in, hidden, classes = sizes
    x = b.var("x", [-1, d_in], need_check_feed=True, stop_gradient=True)
    label = b.var("label", [-1, 1], INT64, need_check_feed=True, stop_gradient=True)
    net.data = {x, label}
    h = net.fc(x, [-1, d_in], hidden, "relu", rng.normal(0, 0.3, (d_in, hidden)),
               rng.normal(0, 0.1, hidden))
    logits = net.fc(h, [-1, hidden], classes, None, rng.normal(0, 0.3, (hidden, classes)),
                    rng.normal(0, 0.1, classes))
    sm = b.var("softmax_with_cross_entropy_0.tmp_0", [-1, classes])
    ce = b.var("softmax_with_cross_entropy_0.tmp_1", [-1, 1])
    b.op("softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]},
         {"Softmax": [sm], "Loss": [ce]},
         {"soft_label": False, "ignore_index": -100, "numeric_stable_mode": True, "axis": -1,
          "use_softmax": True})
    loss_shape = [] if scalar_loss else [1]
    loss = b.var("mean_0.tmp_0", loss_shape)
    b.op("mean", {"X": [ce]}, {"Out": [loss]}, role=FORWARD | LOSS)
    _seed_loss(b, loss, loss_shape)
    b.var(_g(ce), [-1, 1])
    b.op("mean_grad", {"X": [ce], "Out@GRAD": [_g(loss)]}, {"X@GRAD": [_g(ce)]},
         role=BACKWARD)
    b.op("softmax_with_cross_entropy_grad",
         {"Label": [label], "Softmax": [sm], "Loss@GRAD": [_g(ce)]},
         {"Logits@GRAD": [net.grad_var(logits, [-1, classes])]},
         {"soft_label": False, "ignore_index": -100, "numeric_stable_mode": True, "axis": -1,
          "use_softmax": True}, role=BACKWARD)
    net.emit_backward()
    shapes = {n: list(v.shape) for n, v in net.params.items()}
    hyper = {"mu": 0.9, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    lr = 0.1 if optimizer != "adam" else 0.01
    state = _optimizer(net, optimizer, lr, shapes, hyper)
    params = dict(net.params)
    params.update(state)
    ps = dict(net.params)

    def torch_steps(xs, ys, steps, places=1):
        w = {k: torch.tensor(v, requires_grad=True) for k, v in ps.items()}
        opt = _torch_optimizer(optimizer, list(w.values()), lr, hyper)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            h = torch.relu(torch.tensor(xs) @ w["fc_0.w_0"] + w["fc_0.b_0"])
            out = h @ w["fc_1.w_0"] + w["fc_1.b_0"]
            loss = F.cross_entropy(out, torch.tensor(ys).reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, {k: v.detach() for k, v in w.items()}

    m = Model(b.bytes(), s.bytes(), dict(sorted(params.items())), ["x", "label"], [loss], loss)
    m.torch_steps = torch_steps
    m.feed_shapes = {"x": (d_in,), "classes": classes}
    return m


def _torch_optimizer(kind, params, lr, hyper):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=hyper["mu"])
    return torch.optim.Adam(params, lr=lr, betas=(hyper["beta1"], hyper["beta2"]),
                            eps=hyper["epsilon"])


def _conv_block(b, s, net, x, channels, out_channels, hw, rng, is_test, backward):
    """conv2d (+ bias) -> batch_norm -> relu -> pool2d, Paddle's static layers' ops."""
    w = net.param("conv2d_0.w_0", [out_channels, channels, 3, 3],
                  rng.normal(0, 0.3, (out_channels, channels, 3, 3)))
    bias = net.param("conv2d_0.b_0", [out_channels], rng.normal(0, 0.1, out_channels))
    conv = b.var("conv2d_0.tmp_0", [-1, out_channels, hw, hw])
    b.op("conv2d", {"Input": [x], "Filter": [w]}, {"Output": [conv]},
         {"strides": [1, 1], "paddings": [1, 1, 1, 1], "padding_algorithm": "EXPLICIT",
          "groups": 1, "dilations": [1, 1], "data_format": "NCHW", "use_cudnn": True,
          "exhaustive_search": False, "workspace_size_MB": 512, "fuse_relu_before_depthwise_conv":
          False})
    conv_b = b.var("conv2d_0.tmp_1", [-1, out_channels, hw, hw])
    b.op("elementwise_add", {"X": [conv], "Y": [bias]}, {"Out": [conv_b]}, {"axis": 1})
    scale = net.param("batch_norm_0.w_0", [out_channels], 1.0 + rng.normal(0, 0.1, out_channels))
    shift = net.param("batch_norm_0.b_0", [out_channels], rng.normal(0, 0.1, out_channels))
    mean, var = "batch_norm_0.w_1", "batch_norm_0.w_2"
    for builder in (b, s):
        builder.var(mean, [out_channels], persistable=True, stop_gradient=True)
        builder.var(var, [out_channels], persistable=True, stop_gradient=True)
    s.op("fill_constant", outputs={"Out": [mean]},
         attrs={"shape": longs([out_channels]), "value": 0.0, "dtype": FP32})
    s.op("fill_constant", outputs={"Out": [var]},
         attrs={"shape": longs([out_channels]), "value": 1.0, "dtype": FP32})
    stats = {mean: rng.normal(0, 0.1, out_channels).astype(np.float32),
             var: (1.0 + rng.uniform(0, 0.5, out_channels)).astype(np.float32)}
    y = b.var("batch_norm_0.tmp_2", [-1, out_channels, hw, hw])
    saved_mean = b.var("batch_norm_0.tmp_0", [out_channels], stop_gradient=True)
    saved_var = b.var("batch_norm_0.tmp_1", [out_channels], stop_gradient=True)
    bn_attrs = {"momentum": 0.9, "epsilon": 1e-5, "is_test": is_test, "data_layout": "NCHW",
                "use_global_stats": False, "trainable_statistics": False,
                "fuse_with_relu": False}
    b.op("batch_norm", {"X": [conv_b], "Scale": [scale], "Bias": [shift], "Mean": [mean],
                        "Variance": [var]},
         {"Y": [y], "MeanOut": [mean], "VarianceOut": [var], "SavedMean": [saved_mean],
          "SavedVariance": [saved_var]}, bn_attrs)
    act = b.var("relu_0.tmp_0", [-1, out_channels, hw, hw])
    b.op("relu", {"X": [y]}, {"Out": [act]})
    pooled = b.var("pool2d_0.tmp_0", [-1, out_channels, hw // 2, hw // 2])
    pool_attrs = {"pooling_type": "max", "ksize": [2, 2], "global_pooling": False,
                  "strides": [2, 2], "paddings": [0, 0], "padding_algorithm": "EXPLICIT",
                  "use_cudnn": True, "ceil_mode": False, "exclusive": True, "adaptive": False,
                  "data_format": "NCHW"}
    b.op("pool2d", {"X": [act]}, {"Out": [pooled]}, pool_attrs)
    shape4 = [-1, out_channels, hw, hw]

    def back():
        b.op("pool2d_grad", {"X": [act], "Out": [pooled], "Out@GRAD": [_g(pooled)]},
             {"X@GRAD": [net.grad_var(act, shape4)]}, pool_attrs, role=BACKWARD)
        b.op("relu_grad", {"Out": [act], "Out@GRAD": [_g(act)]},
             {"X@GRAD": [net.grad_var(y, shape4)]}, role=BACKWARD)
        b.op("batch_norm_grad", {"X": [conv_b], "Scale": [scale], "Bias": [shift],
                                 "SavedMean": [saved_mean], "SavedVariance": [saved_var],
                                 "Y@GRAD": [_g(y)]},
             {"X@GRAD": [net.grad_var(conv_b, shape4)],
              "Scale@GRAD": [net.grad_var(scale, [out_channels])],
              "Bias@GRAD": [net.grad_var(shift, [out_channels])]}, bn_attrs, role=BACKWARD,
             role_var=[scale, _g(scale), shift, _g(shift)])
        b.op("elementwise_add_grad", {"X": [conv], "Y": [bias], "Out@GRAD": [_g(conv_b)]},
             {"X@GRAD": [net.grad_var(conv, shape4)],
              "Y@GRAD": [net.grad_var(bias, [out_channels])]}, {"axis": 1}, role=BACKWARD,
             role_var=[bias, _g(bias)])
        b.op("conv2d_grad", {"Input": [x], "Filter": [w], "Output@GRAD": [_g(conv)]},
             {"Input@GRAD": [EMPTY], "Filter@GRAD": [net.grad_var(w, [out_channels, channels,
                                                                       3, 3])]},
             {"strides": [1, 1], "paddings": [1, 1, 1, 1], "padding_algorithm": "EXPLICIT",
              "groups": 1, "dilations": [1, 1], "data_format": "NCHW"}, role=BACKWARD,
             role_var=[w, _g(w)])
    if backward is not None:
        backward.append(back)
    return pooled, stats, (w, bias, scale, shift, mean, var)


def _torch_cnn(w, x, stats, training, momentum=0.9, eps=1e-5):
    """The PyTorch computation of cnn(); ``stats`` (mean, var) updated the Paddle way."""
    y = F.conv2d(x, w["conv2d_0.w_0"], w["conv2d_0.b_0"], padding=1)
    mean, var = stats
    if training:
        bm = y.mean(dim=(0, 2, 3))
        bv = y.var(dim=(0, 2, 3), unbiased=False)
        yn = (y - bm[None, :, None, None]) / torch.sqrt(bv[None, :, None, None] + eps)
        new_stats = (mean * momentum + bm.detach() * (1 - momentum),
                     var * momentum + bv.detach() * (1 - momentum))
    else:
        yn = (y - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + eps)
        new_stats = stats
    yn = yn * w["batch_norm_0.w_0"][None, :, None, None] + w["batch_norm_0.b_0"][None, :, None,
                                                                                 None]
    h = F.max_pool2d(torch.relu(yn), 2, 2)
    out = h.reshape(h.shape[0], -1) @ w["fc_0.w_0"] + w["fc_0.b_0"]
    return out, new_stats


def cnn(optimizer="adam", seed=1, channels=2, out_channels=4, hw=6, classes=3):
    """conv2d/batch_norm/relu/pool2d, then fc and softmax cross entropy; 0-d mean loss."""
    rng = np.random.default_rng(seed)
    b, s = ProgramBuilder(), ProgramBuilder()
    net = _Net(b, s, rng)
    x = b.var("img", [-1, channels, hw, hw], need_check_feed=True, stop_gradient=True)
    label = b.var("label", [-1, 1], INT64, need_check_feed=True, stop_gradient=True)
    net.data = {x, label}
    pooled, stats, _ = _conv_block(b, s, net, x, channels, out_channels, hw, rng, False,
                                   net.backward)
    flat = out_channels * (hw // 2) ** 2
    logits = net.fc(pooled, [-1, out_channels, hw // 2, hw // 2], classes, None,
                    rng.normal(0, 0.3, (flat, classes)), rng.normal(0, 0.1, classes))
    sm = b.var("softmax_with_cross_entropy_0.tmp_0", [-1, classes])
    ce = b.var("softmax_with_cross_entropy_0.tmp_1", [-1, 1])
    swce_attrs = {"soft_label": False, "ignore_index": -100, "numeric_stable_mode": True,
                  "axis": -1, "use_softmax": True}
    b.op("softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]},
         {"Softmax": [sm], "Loss": [ce]}, swce_attrs)
    loss = b.var("mean_0.tmp_0", [])
    red_attrs = {"dim": [], "keep_dim": False, "reduce_all": True, "in_dtype": -1,
                 "out_dtype": -1}
    b.op("reduce_mean", {"X": [ce]}, {"Out": [loss]}, red_attrs, role=FORWARD | LOSS)
    _seed_loss(b, loss, [])
    b.var(_g(ce), [-1, 1])
    b.op("reduce_mean_grad", {"X": [ce], "Out@GRAD": [_g(loss)]}, {"X@GRAD": [_g(ce)]},
         red_attrs, role=BACKWARD)
    b.op("softmax_with_cross_entropy_grad",
         {"Label": [label], "Softmax": [sm], "Loss@GRAD": [_g(ce)]},
         {"Logits@GRAD": [net.grad_var(logits, [-1, classes])]}, swce_attrs, role=BACKWARD)
    net.emit_backward()
    shapes = {n: list(v.shape) for n, v in net.params.items()}
    hyper = {"mu": 0.9, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    lr = 0.01
    state = _optimizer(net, optimizer, lr, shapes, hyper)
    params = dict(net.params)
    params.update(state)
    params.update(stats)
    ps = dict(net.params)

    def torch_steps(xs, ys, steps, places=1):
        w = {k: torch.tensor(v, requires_grad=True) for k, v in ps.items()}
        opt = _torch_optimizer(optimizer, list(w.values()), lr, hyper)
        st = [(torch.tensor(stats["batch_norm_0.w_1"]), torch.tensor(stats["batch_norm_0.w_2"]))
              for _ in range(places)]
        losses = []
        xt, yt = torch.tensor(xs), torch.tensor(ys).reshape(-1)
        for _ in range(steps):
            opt.zero_grad()
            parts = []
            for p, (xp, yp) in enumerate(zip(xt.chunk(places), yt.chunk(places), strict=True)):
                out, st[p] = _torch_cnn(w, xp, st[p], True)
                parts.append(F.cross_entropy(out, yp))
            loss = sum(parts) / places
            loss.backward()
            opt.step()
            losses.append(loss.item())
        final = {k: v.detach() for k, v in w.items()}
        final["batch_norm_0.w_1"], final["batch_norm_0.w_2"] = st[0]
        return losses, final

    m = Model(b.bytes(), s.bytes(), dict(sorted(params.items())), ["img", "label"], [loss],
              loss)
    m.torch_steps = torch_steps
    m.feed_shapes = {"img": (channels, hw, hw), "classes": classes}
    return m


def cnn_inference(seed=2, channels=2, out_channels=4, hw=6, classes=3):
    """``save_inference_model`` of the CNN: feed/fetch ops, is_test batch norm, softmax."""
    rng = np.random.default_rng(seed)
    b, s = ProgramBuilder(), ProgramBuilder()
    net = _Net(b, s, rng)
    b.var("feed", [], kind=FEED_MINIBATCH, persistable=True)
    b.var("fetch", [], kind=FETCH_LIST, persistable=True)
    x = b.var("img", [-1, channels, hw, hw], need_check_feed=True, stop_gradient=True)
    b.op("feed", {"X": ["feed"]}, {"Out": [x]}, {"col": 0})
    net.data = {x}
    pooled, stats, _ = _conv_block(b, s, net, x, channels, out_channels, hw, rng, True, None)
    flat = out_channels * (hw // 2) ** 2
    logits = net.fc(pooled, [-1, out_channels, hw // 2, hw // 2], classes, None,
                    rng.normal(0, 0.3, (flat, classes)), rng.normal(0, 0.1, classes))
    prob = b.var("softmax_0.tmp_0", [-1, classes])
    b.op("softmax", {"X": [logits]}, {"Out": [prob]}, {"axis": -1, "use_cudnn": False,
                                                         "data_format": "AnyLayout"})
    b.op("fetch", {"X": [prob]}, {"Out": ["fetch"]}, {"col": 0})
    params = dict(net.params)
    params.update(stats)

    def torch_forward(xs):
        w = {k: torch.tensor(v) for k, v in net.params.items()}
        st = (torch.tensor(stats["batch_norm_0.w_1"]), torch.tensor(stats["batch_norm_0.w_2"]))
        out, _ = _torch_cnn(w, torch.tensor(xs), st, False)
        return torch.softmax(out, -1)

    m = Model(b.bytes(), s.bytes(), dict(sorted(params.items())), [x], [prob])
    m.torch_forward = torch_forward
    m.feed_shapes = {"img": (channels, hw, hw), "classes": classes}
    return m


def feed_for(model, batch, seed=0):
    rng = np.random.default_rng(100 + seed)
    name = model.feed[0]
    xs = rng.normal(0, 1, (batch,) + tuple(model.feed_shapes[name])).astype(np.float32)
    ys = rng.integers(0, model.feed_shapes["classes"], (batch, 1)).astype(np.int64)
    return xs, ys
