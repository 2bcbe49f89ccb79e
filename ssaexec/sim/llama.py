"""A Llama-style model and its prediction against torchtitan's published FSDP2 runs.

``build_llama`` writes a Llama 3 decoder (RMSNorm, grouped-query attention with
rotary embeddings, a SwiGLU MLP, untied output, AdamW) with the builder API;
``LLAMA3_8B`` is Llama 3.1 8B's shape (8.03B parameters). ``predict_tokens`` predicts
tokens/s per GPU and each device's memory under ZeRO-3 (FSDP2's sharding) by the path
``ssaexec simulate`` takes: a roofline profile of the program on the cluster's GPU,
one process per GPU, the step replayed (``sim.predict``) with the graph's gathers,
reduce-scatters, frees and prefetch; memory from ``sim.memory``.

What the program cannot say, and how the profile says it (each a modelling decision,
none read from a published figure):

* **Attention is FlashAttention.** The builder has no fused attention op, so the
  attention core is written unfused (scores, softmax, weighted sum, on ``[B, kv
  heads, group x S, S]``: the query heads of a key/value head grouped, GQA). The run
  it stands for calls ``scaled_dot_product_attention``, whose flash kernel keeps the
  scores on chip: ``flash_profile`` charges the forward ops one kernel of ``4 B H S^2
  D`` FLOPs (half with the causal mask) and the backward ops one of 2.5 times that
  (five products instead of two: the scores are recomputed), at the ``attention``
  share of the tensor cores' peak (``efficiency.PRIOR``: 35 %, what FlashAttention-2
  reaches on an H100, Shah et al., "FlashAttention-3", 2024, abstract); the memory
  prediction leaves the scores out.
* **Selective activation checkpointing** (``ac="op"``, torchtitan's default for
  Llama 3 8B): backward recomputes what forward did not save. torchtitan's op policy
  saves the attention output and every other matrix product of a block (counting
  per block: the 1st, 3rd, 5th and 7th of wq, wk, wv, wo, w1, w3, w2), so wk, wo and
  w3 and every elementwise op of the block run twice; ``recompute_profile`` adds
  their forward time to the block's first backward op, where the recomputation runs.

Policy: the model's shape, batch, sequence length, precision and checkpointing are
the published run's (``TORCHTITAN`` names the sources); the cluster and the
efficiency shares are the simulator's, as for every other published row; nothing here
reads a published throughput to make a prediction.
"""

from ..core.errors import SSAExecError

__all__ = ["LLAMA3_8B", "TORCHTITAN", "build_llama", "flash_profile", "recompute_profile",
           "llama_profile", "predict_tokens", "parameter_count", "checkpoint_spec",
           "flops_per_token"]

# Llama 3.1 8B (Meta's params.json: dim 4096, 32 layers, 32 heads, 8 key/value heads,
# ffn_dim_multiplier 1.3 and multiple_of 1024 -> hidden 14336, vocabulary 128256)
LLAMA3_8B = dict(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256)

# torchtitan's published FSDP2 runs of Llama 3.1 8B (docs/performance.md at
# eaea6f6a2fa9, "Table 1" and "Table 3"; torchtitan 9dec370 of 2024-12-26, torch
# 1963fc8): Grand Teton hosts of 8 H100 (96 GB HBM2e, 2.4 TB/s, 500 W power limit)
# fully connected with NVLink, 400 Gb/s RDMA per GPU between hosts; local batch 2;
# sequence length 8192 (train_configs/llama3_8b.toml); selective activation
# checkpointing by op; bf16 parameters for compute, fp32 reduce-scatter
# (mixed_precision_param bf16, mixed_precision_reduce fp32); AdamW, grad-norm clipping
# 1.0. TPS/GPU read at the 90th iteration; memory: peak reserved GiB.
TORCHTITAN = {
    "source": "pytorch/torchtitan docs/performance.md (commit eaea6f6a2fa9), Tables 1 and 3; "
              "train_configs/llama3_8b.toml (seq_len 8192, selective op AC)",
    "batch": 2, "seq_len": 8192, "ac": "op",
    "rows": [
        {"id": "llama3-8b-fsdp-8", "gpus": 8, "tps_per_gpu": 5762, "memory_gib": 82.4,
         "compiled": False, "cluster": "grand-teton-h100", "batch": 2},
        {"id": "llama3-8b-fsdp-compile-8", "gpus": 8, "tps_per_gpu": 6667,
         "memory_gib": 77.0, "compiled": True, "cluster": "grand-teton-h100", "batch": 2},
        {"id": "llama3-8b-fsdp-128", "gpus": 128, "tps_per_gpu": 5605, "memory_gib": 67.0,
         "compiled": False, "cluster": "grand-teton-h100", "batch": 2},
        {"id": "llama3-8b-fsdp-compile-128", "gpus": 128, "tps_per_gpu": 6514,
         "memory_gib": 62.0, "compiled": True, "cluster": "grand-teton-h100", "batch": 2},
        # the earlier table of the same document (commit 041336434916): Llama 3 8B (the
        # 3.1 shape), 64 A100 80GB, local batch 1, selective op AC, eager; the A100
        # cluster's network is not stated (dgx-a100's assumed)
        {"id": "llama3-8b-a100-fsdp-64", "gpus": 64, "tps_per_gpu": 2973, "memory_gib": None,
         "compiled": False, "cluster": "dgx-a100", "batch": 1},
    ],
}


def parameter_count(layers, dim, heads, kv_heads, ffn, vocab):
    """Parameters of the Llama decoder ``build_llama`` writes."""
    kv = dim // heads * kv_heads
    block = dim * dim * 2 + dim * kv * 2 + 3 * dim * ffn + 2 * dim
    return layers * block + 2 * vocab * dim + dim


class LlamaProgram:
    """``build_llama``'s result: the program, its loss and what the profile needs to
    know about each block (``blocks``: dicts of op indices and var names)."""

    __slots__ = ("main", "startup", "loss", "blocks", "shape", "seq_len")

    def __init__(self, main, startup, loss, blocks, shape, seq_len):
        self.main, self.startup, self.loss = main, startup, loss
        self.blocks, self.shape, self.seq_len = blocks, shape, seq_len

    @property
    def attention_scores(self):
        """Names of the unfused attention's score tensors (never materialised by flash)."""
        return {n for b in self.blocks for n in b["scores"]}


def build_llama(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                seq_len=8192, optimizer=None, seed=0):
    """A Llama 3 decoder's training program (module docstring); ``LlamaProgram``."""
    from ..program import layers as L
    from ..program import optimizer as opt
    from ..program.builder import program_guard
    from ..program.desc import Program
    if dim % heads or heads % kv_heads:
        raise SSAExecError(f"dim {dim} must divide by heads {heads}, heads by kv_heads "
                           f"{kv_heads}")
    hd, group = dim // heads, heads // kv_heads
    main, startup = Program(seed), Program(seed)
    blocks = []
    with program_guard(main, startup):
        ids = L.data("tokens", [-1, seq_len], "int64")
        labels = L.data("labels", [-1, seq_len, 1], "int64")
        cos = L.data("rope_cos", [seq_len, hd])
        sin = L.data("rope_sin", [seq_len, hd])
        h = L.embedding(ids, [vocab, dim], name="tok_embeddings")
        block = main.global_block()

        def rms(x):  # RMSNorm: a scale, no shift (the norm class: its bytes)
            return L.layer_norm(x, begin_norm_axis=2, shift=False)

        def rope(x):  # [B, H, S, D] * cos + rotated * sin (rotation: a view)
            return L.elementwise_add(L.elementwise_mul(x, cos), L.elementwise_mul(x, sin))

        for _ in range(layers):
            first = len(block.ops)
            x = rms(h)
            q = L.fc(x, dim, num_flatten_dims=2, bias_attr=False)
            k = L.fc(x, kv_heads * hd, num_flatten_dims=2, bias_attr=False)
            v = L.fc(x, kv_heads * hd, num_flatten_dims=2, bias_attr=False)
            q = rope(L.transpose(L.reshape(q, [0, 0, heads, hd]), [0, 2, 1, 3]))
            k = rope(L.transpose(L.reshape(k, [0, 0, kv_heads, hd]), [0, 2, 1, 3]))
            v = L.transpose(L.reshape(v, [0, 0, kv_heads, hd]), [0, 2, 1, 3])
            # GQA: the query heads of one key/value head side by side
            qg = L.reshape(q, [0, kv_heads, group * seq_len, hd])
            att_first = len(block.ops)
            scores = L.matmul(qg, k, transpose_y=True, alpha=hd ** -0.5)
            probs = L.softmax(scores)
            ctx = L.matmul(probs, v)
            att_last = len(block.ops)
            ctx = L.reshape(L.transpose(L.reshape(ctx, [0, heads, seq_len, hd]),
                                        [0, 2, 1, 3]), [0, 0, dim])
            wo = L.fc(ctx, dim, num_flatten_dims=2, bias_attr=False)
            h = L.elementwise_add(h, wo)
            x = rms(h)
            w1 = L.fc(x, ffn, num_flatten_dims=2, bias_attr=False)
            w3 = L.fc(x, ffn, num_flatten_dims=2, bias_attr=False)
            act = L.elementwise_mul(w1, L.sigmoid(w1))  # SiLU
            w2 = L.fc(L.elementwise_mul(act, w3), dim, num_flatten_dims=2, bias_attr=False)
            h = L.elementwise_add(h, w2)
            blocks.append({"ops": (first, len(block.ops)), "attention": (att_first, att_last),
                           "scores": (scores.name, probs.name), "out": h.name,
                           "recomputed_products": _recomputed(block, first, len(block.ops))})
        logits = L.fc(rms(h), vocab, num_flatten_dims=2, bias_attr=False)
        loss = L.mean(L.softmax_with_cross_entropy(logits, labels))
        (optimizer or opt.AdamW(3e-4)).minimize(loss)
    shape = dict(layers=layers, dim=dim, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab)
    return LlamaProgram(main, startup, loss.name, blocks, shape, seq_len)


def _recomputed(block, first, last):
    """Indices of the block's 2nd, 4th and 6th matrix products (torchtitan's op policy
    saves every other one, counting from 1 in each block's forward)."""
    products = [i for i in range(first, last) if block.ops[i].type == "mul"]
    return tuple(products[j] for j in range(1, len(products), 2))


def checkpoint_spec(model):
    """torchtitan's op policy as ``sim.memory.activation_peak``'s ``checkpoint``: per
    block, its forward ops and what it saves (the 1st, 3rd, 5th and 7th products'
    results and the attention output; the block's input and output are kept anyway)."""
    ops = model.main.global_block().ops
    out = []
    for blk in model.blocks:
        lo, hi = blk["ops"]
        saved = {n for i in range(lo, hi) if ops[i].type == "mul" and
                 i not in blk["recomputed_products"] for n in ops[i].output_names()}
        saved.update(ops[blk["attention"][1] - 1].output_names())
        out.append((lo, hi, saved))
    return out


def _key(program, op):
    from ..graph.passes import op_reads_writes
    return f"{op.type}|{','.join(op_reads_writes(program, op)[1])}"


def _readers_of_grad(program, names):
    """Indices of backward ops that read the gradient of any of ``names``."""
    grads = {n + "@GRAD" for n in names}
    return [i for i, op in enumerate(program.global_block().ops)
            if op.role in ("backward", "loss") and grads & set(op.input_names())]


def flash_profile(model, profile, device, precision="amp", efficiency=None):
    """``profile`` with each block's attention core costed as FlashAttention's fused
    forward and backward kernels (module docstring); returns a new ``Profile``."""
    from .efficiency import shares
    from .profile import OpCost, Profile
    unit = {"amp": "fp16", "tf32": "tf32", "fp32": "fp32"}[precision]
    peak = {"fp16": device.flops_low, "tf32": device.flops_tf32, "fp32": device.flops}[unit]
    share = shares(efficiency)["attention"][unit]
    s = model.shape
    b, seq, hd = profile.batch, model.seq_len, s["dim"] // s["heads"]
    fwd_flops = 4 * b * s["heads"] * seq * seq * hd / 2  # causal: half the tiles
    fwd = max(fwd_flops / (peak * share), device.kernel_min)
    bwd = max(2.5 * fwd_flops / (peak * share), device.kernel_min)
    prog = model.main
    ops = prog.global_block().ops
    costs = dict(profile.costs)
    for blk in model.blocks:
        lo, hi = blk["attention"]
        fwd_keys = [_key(prog, ops[i]) for i in range(lo, hi)]
        for j, k in enumerate(fwd_keys):
            costs[k] = OpCost(fwd if j == 0 else 0.0)
        outs = [n for i in range(lo, hi) for n in ops[i].output_names()]
        bwd_keys = [_key(prog, ops[i]) for i in _readers_of_grad(prog, outs)]
        for j, k in enumerate(bwd_keys):
            costs[k] = OpCost(bwd if j == 0 else 0.0)
    return Profile(costs, profile.batch, profile.device, profile.wall, profile.threads,
                   profile.source + f"; attention as FlashAttention at {share:.0%} of peak",
                   profile.side_by_side)


def recompute_profile(model, profile):
    """``profile`` with torchtitan's selective activation checkpointing (op policy): each
    block's elementwise forward ops and its 2nd, 4th and 6th products run again at the
    start of its backward (module docstring); returns a new ``Profile``."""
    from .efficiency import op_class
    from .profile import OpCost, Profile
    prog = model.main
    ops = prog.global_block().ops
    costs = dict(profile.costs)
    for blk in model.blocks:
        lo, hi = blk["ops"]
        a_lo, a_hi = blk["attention"]
        again = 0.0
        for i in range(lo, hi):
            if a_lo <= i < a_hi:
                continue  # the attention output is saved
            c = op_class(ops[i].type)
            if c in ("norm", "elementwise") or i in blk["recomputed_products"]:
                cost = costs.get(_key(prog, ops[i]))
                again += cost.device_s if cost else 0.0
        first_bwd = _readers_of_grad(prog, [blk["out"]])
        if not first_bwd:
            raise SSAExecError(f"no backward op reads {blk['out']}@GRAD")
        k = _key(prog, ops[first_bwd[0]])
        old = costs.get(k, OpCost(0.0))
        costs[k] = OpCost(old.device_s + again, old.host_s)
    return Profile(costs, profile.batch, profile.device, profile.wall, profile.threads,
                   profile.source + "; selective activation checkpointing (op policy)",
                   profile.side_by_side)


def llama_profile(model, batch, device, precision="amp", ac="op", efficiency=None):
    """The roofline profile of ``model`` at ``batch`` sequences per GPU: the estimate,
    flash attention, and with ``ac="op"`` torchtitan's selective recomputation."""
    from .profile import Profile
    profile = Profile.estimate(model.main, batch, device, precision, efficiency)
    profile = flash_profile(model, profile, device, precision, efficiency)
    if ac == "op":
        profile = recompute_profile(model, profile)
    elif ac not in (None, "none"):
        raise SSAExecError(f"ac must be 'op' or None, got {ac!r}")
    return profile


def predict_tokens(gpus, cluster="dgx-h100", batch=2, seq_len=8192, layers=None,
                   zero_stage=3, precision="amp", ac="op", prefetch=1, model=None,
                   profile=None, cache=None, **kw):
    """Predict Llama 3.1 8B (or ``model``) on ``gpus`` GPUs, one process each.

    Returns a dict: ``tokens_per_sec_per_gpu``, ``step_s``, ``prediction`` (the
    ``Prediction``), ``memory`` (``sim.memory.MemoryPrediction``), ``strategy``.
    ``layers`` builds a shorter model of the same width (tests).
    """
    from ..core.strategy import BuildStrategy
    from .cluster import get_cluster
    from .memory import predict_memory
    from .predict import predict
    cluster = get_cluster(cluster)
    if model is None:
        shape = dict(LLAMA3_8B, **({"layers": layers} if layers else {}))
        model = build_llama(seq_len=seq_len, **shape)
    if profile is None:
        profile = llama_profile(model, batch, cluster.device, precision, ac)
    opts = dict(fuse_all_reduce_ops=True, fuse_bucket_mb=25.0)
    if zero_stage:
        opts.update(zero_stage=zero_stage)
        if zero_stage == 3:
            opts.update(zero_prefetch=prefetch, zero_gather_dtype="bf16")
    try:
        bs = BuildStrategy(**opts)
    except (SSAExecError, TypeError) as e:
        raise SSAExecError(f"this build cannot make a ZeRO-{zero_stage} graph yet: {e}") \
            from None
    p = predict(model.main, profile, cluster, gpus, "process-per-gpu", bs,
                cuda_graph=False, cache=cache, **kw)
    memory = predict_memory(model.main, gpus, zero_stage, batch=batch, prefetch=prefetch,
                            gather_dtype="bf16" if zero_stage == 3 else None,
                            precision=precision, exclude=model.attention_scores,
                            checkpoint=checkpoint_spec(model) if ac == "op" else ())
    tokens = batch * model.seq_len
    return {"tokens_per_sec_per_gpu": tokens / p.step_s, "step_s": p.step_s,
            "prediction": p, "memory": memory, "strategy": bs, "model": model,
            "profile": profile, "mfu_flops_per_token": flops_per_token(model)}


def flops_per_token(model):
    """torchtitan's model FLOPs per token: ``6 N + 12 L H Q T`` (``N`` without the token
    embedding; ``Q`` the head dim, ``T`` the sequence length), as its MFU counts them."""
    s = model.shape
    n = parameter_count(**s) - s["vocab"] * s["dim"]
    return 6 * n + 12 * s["layers"] * s["heads"] * (s["dim"] // s["heads"]) * model.seq_len


def compare(rows=None, extra_gpus=(64,), model=None):
    """Predict every published row (and the H100 cluster at ``extra_gpus`` GPUs, which
    has no published figure); a list of dicts: the row, ``predicted`` tokens/s/GPU,
    ``error`` (None without a figure), ``result`` (``predict_tokens``'s)."""
    from .cluster import get_cluster
    model = model or build_llama(seq_len=TORCHTITAN["seq_len"], **LLAMA3_8B)
    rows = list(rows or TORCHTITAN["rows"])
    rows += [{"id": f"llama3-8b-fsdp-{n}", "gpus": n, "tps_per_gpu": None, "memory_gib": None,
              "compiled": None, "cluster": "grand-teton-h100", "batch": TORCHTITAN["batch"]}
             for n in extra_gpus]
    profiles, cache, out = {}, {}, []
    for row in sorted(rows, key=lambda r: (r["cluster"], r["gpus"])):
        cluster = get_cluster(row["cluster"])
        key = (cluster.name, row["batch"])
        if key not in profiles:
            profiles[key] = llama_profile(model, row["batch"], cluster.device)
        r = predict_tokens(row["gpus"], cluster, batch=row["batch"], model=model,
                           profile=profiles[key], cache=cache)
        tps = r["tokens_per_sec_per_gpu"]
        out.append({"row": row, "predicted": tps, "result": r,
                    "error": tps / row["tps_per_gpu"] - 1 if row["tps_per_gpu"] else None})
    return out


def format_table(results):
    """The comparison as Markdown (docs/simulator.md)."""
    lines = ["| row | cluster | GPUs | batch | published TPS/GPU | predicted | error | "
             "exposed comm | memory published GiB | predicted GiB (model state) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        row, res = r["row"], r["result"]
        p, m = res["prediction"], res["memory"]
        pub = f"{row['tps_per_gpu']:,}" if row["tps_per_gpu"] else "-"
        if row["compiled"]:
            pub += " (compiled)"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        mem = f"{row['memory_gib']}" if row.get("memory_gib") else "-"
        lines.append(f"| {row['id']} | {row['cluster']} | {row['gpus']} | {row['batch']} | "
                     f"{pub} | {r['predicted']:,.0f} | {err} | "
                     f"{p.comm_exposed_s / p.step_s:.1%} | {mem} | "
                     f"{m.peak_bytes / 2**30:.1f} ({m.model_state_bytes / 2**30:.1f}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m ssaexec.sim.llama: the table of docs/simulator.md
    import sys
    sys.stdout.write(format_table(compare()))
