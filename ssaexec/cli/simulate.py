"""``ssaexec simulate``: predict a program's step time and images/sec on 1 to N GPUs.

The numbers come from ``ssaexec.sim`` (docs/simulator.md): op costs from a profile
(``--profile``: an ``ssaexec trace`` file or a saved profile; else a roofline
estimate for the cluster's GPUs, or a measurement on this machine for a CPU
cluster), a cluster (a preset or a calibrated JSON file), and a discrete-event
replay of one process's step per configuration. This module only parses options,
picks the profile and the output form.
"""

import sys
from pathlib import Path

from ..sim.input_pipeline import PIPELINES
from ..sim.profile import PRECISIONS
from ..sim.published import MODELS
from .common import EXIT_OK, UsageError, load_program_file, positive, zero_options, zero_settings


__all__ = ["register"]

EPILOG = """\
For every number of GPUs, the step is replayed with one process per GPU and with
one process per node driving all its GPUs, with and without CUDA-graph replay;
the table shows the fastest, the efficiency against one GPU of the same layout,
how much communication is exposed, and what bounds the step (the critical path:
device compute, host launches, the GIL, communication, scheduler hand-offs).
Clusters: dgx-h100, dgx-a100, dgx-1v, pcie, ethernet-100g, big-basin-50gbe,
pascal-25gbe, grand-teton-h100, or a JSON file (Cluster.to_dict; bench/validate_sim.py writes one for
this machine's CPU places).

Beyond the replayed step, each row charges what grows with the cluster: compute
slowed by the collectives beside it (calibrated), the slowest rank's jitter (the
expected maximum over N ranks) and the input pipeline's stall; "why efficiency
falls" lists them. docs/simulator.md shows the model against published results
(make validate-sim-published).

examples:
  ssaexec simulate --model resnet50 --cluster dgx-a100 --batch 256 --cuda-graph off \
    --input imagenet-cpu --gpus 1,8,64,512
  ssaexec simulate examples/small_resnet.json --gpus 1,2,4,8,64,1024 --cluster dgx-h100
  ssaexec simulate examples/small_resnet.json --gpus 8,64 --sweep bucket-mb
  ssaexec simulate examples/mnist_mlp.json --cluster pcie --allreduce-dtype bf16 --json
  ssaexec simulate examples/small_resnet.json --gpus 8,64 --zero 3 --zero-gather-dtype bf16
  ssaexec trace examples/small_resnet.json -o t.json --places cuda:0 --cuda-sync && \\
    ssaexec simulate examples/small_resnet.json --profile t.json
"""


def _gpus(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected comma-separated counts, like "
                         "1,2,4,8") from None
    if not out or any(n < 1 for n in out):
        raise UsageError(f"--gpus {text!r}: every count must be >= 1")
    return sorted(set(out))


def _sizes(text):
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--bucket-sizes {text!r}: expected MiB values like 1,4,25") from None
    if not out or any(x <= 0 for x in out):
        raise UsageError(f"--bucket-sizes {text!r}: sizes must be positive")
    return out


def register(add):
    """Add the ``simulate`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("simulate", "predict step time and images/sec on 1 to N GPUs (no GPU needed)",
            EPILOG)
    p.add_argument("program", metavar="PROGRAM", nargs="?", default=None,
                   help="program file (.json or .ssa); or --model")
    p.add_argument("--model", choices=MODELS, default=None,
                   help="a built-in model instead of PROGRAM: ResNet-50/101 on 224x224 "
                        "ImageNet images, BERT-Large pre-training at sequence length 128 "
                        "(the models of the published validation table)")
    p.add_argument("--gpus", default="1,2,4,8,64,1024", metavar="N,N,...",
                   help="GPU counts to predict (default: %(default)s)")
    p.add_argument("--cluster", default="dgx-h100", metavar="NAME|FILE.json",
                   help="a preset (default dgx-h100; see below) or a saved cluster")
    p.add_argument("--profile", metavar="FILE.json", default=None,
                   help="op durations: an 'ssaexec trace' file (one place) or a saved "
                        "profile; default: a roofline estimate (GPU clusters) or a "
                        "measurement on this machine (CPU clusters)")
    p.add_argument("--batch", "-b", type=positive, default=32,
                   help="samples per GPU for an estimated or measured profile (default 32)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="how an estimated profile's convolutions and products run: fp32 "
                        "(CUDA cores), tf32 (the default where the GPU has it), amp "
                        "(fp16/bf16 tensor cores, 2-byte activations)")
    p.add_argument("--input", choices=tuple(PIPELINES), default="synthetic",
                   help="input pipeline per step: synthetic (default: costs nothing), "
                        "imagenet-cpu (JPEG decode on the node's cores), imagenet-dali, "
                        "tokens")
    p.add_argument("--jitter-cv", type=float, default=None, metavar="CV",
                   help="spread of one rank's step time, std/mean (default: the "
                        "cluster's; 0 turns the stragglers' cost off)")
    p.add_argument("--layout", choices=("both", "process-per-gpu", "process-per-node"),
                   default="both", help="process layouts to compare (default: both)")
    p.add_argument("--cuda-graph", choices=("both", "on", "off"), default="both",
                   help="replay CUDA graphs (GPU clusters; default: both)")
    g = p.add_argument_group("build strategy")
    g.add_argument("--reduce-strategy", choices=("all_reduce", "reduce"), default="all_reduce")
    g.add_argument("--fuse-bucket-mb", type=float, default=None, metavar="MB",
                   help="fuse gradients into all-reduce buckets of MB MiB (default: as the "
                        "executor, 25 MiB buckets across processes, unfused in one)")
    g.add_argument("--allreduce-dtype", choices=("bf16", "fp16"), default=None,
                   help="compress gradients for the all-reduce")
    g.add_argument("--accumulate", type=positive, default=1, metavar="K",
                   help="gradient accumulation: communicate every K micro-batches")
    zero_options(g, "ZeRO stage (3: parameters gathered before use, FSDP2's sharding); "
                    "the report adds each device's predicted peak memory")
    g.add_argument("--algorithm", choices=("auto", "ring", "tree", "hierarchical"),
                   default="auto", help="all-reduce algorithm (default: the fastest)")
    g.add_argument("--host-op-us", type=float, default=None, metavar="US",
                   help="host launch time per op (default: the cluster's, or the profile's)")
    o = p.add_argument_group("output")
    o.add_argument("--sweep", choices=("bucket-mb",), default=None,
                   help="bucket-mb: also try fused all-reduce bucket sizes at each GPU count")
    o.add_argument("--bucket-sizes", default="1,4,16,25,64,256", metavar="MB,MB,...",
                   help="sizes for --sweep bucket-mb (default: %(default)s)")
    o.add_argument("--json", action="store_true", help="print JSON instead of the table")
    o.add_argument("--plot", metavar="FILE.png", default=None,
                   help="plot of images/sec and efficiency (default: "
                        "STEM.CLUSTER.simulate.png in the current directory)")
    o.add_argument("--no-plot", action="store_true", help="write no plot")
    p.set_defaults(func=cmd_simulate)


def _profile(args, program, cluster):
    from ..core.errors import ProgramError, SSAExecError
    from ..program.json_scan import load_bounded
    from ..core.safe_files import read_regular
    from ..sim import Profile
    if args.profile:
        try:
            # untrusted like a program: a regular file (a FIFO is refused, not waited on),
            # bounded nesting, finite numbers (json_scan)
            doc = load_bounded(read_regular(args.profile).decode("utf-8"), args.profile)
        except OSError as e:
            raise UsageError(f"{args.profile}: cannot read: {e.strerror or e}") from None
        except (ValueError, ProgramError) as e:
            raise UsageError(f"{args.profile}: not JSON ({e})") from None
        if isinstance(doc, dict) and "costs" in doc:
            return Profile.from_dict(doc)
        if isinstance(doc, dict) and "traceEvents" in doc:
            return Profile.from_trace(doc, readable_extra_s=cluster.host.readable_extra_s)
        raise UsageError(f"{args.profile}: neither an 'ssaexec trace' file nor a profile")
    if cluster.device.is_gpu:
        try:
            return Profile.estimate(program, args.batch, cluster.device, args.precision)
        except SSAExecError as e:
            raise UsageError(f"--precision: {e}") from None
    return Profile.measure(program, batch=args.batch,
                           readable_extra_s=cluster.host.readable_extra_s)


def _memory(program, strategy, gpus, profile, args):
    """Each GPU count's predicted per-device memory (``sim.memory``, as ``ssaexec stats
    --zero``), for the profile's batch."""
    from ..core.errors import SSAExecError
    from ..sim.memory import strategy_memory
    try:
        return {n: strategy_memory(program, strategy, n, profile.batch, args.precision)
                for n in gpus}
    except SSAExecError as e:
        raise UsageError(str(e)) from None


def cmd_simulate(args):
    from .. import sim
    from ..core.errors import SSAExecError
    from ..sim import report
    from ..core.strategy import BuildStrategy
    if (args.program is None) == (args.model is None):
        raise UsageError("give a PROGRAM file or --model NAME (one of them)")
    if args.model is not None:
        from ..sim.published import build_model
        program, args.program = build_model(args.model), f"--model {args.model}"
    else:
        program = load_program_file(args.program)
    gpus = _gpus(args.gpus)
    try:
        cluster = sim.get_cluster(args.cluster)
    except SSAExecError as e:
        raise UsageError(str(e)) from None
    if args.host_op_us is not None:
        cluster = cluster.with_host(op_s=args.host_op_us * 1e-6)
    if args.jitter_cv is not None:
        if not 0 <= args.jitter_cv < 1:
            raise UsageError(f"--jitter-cv {args.jitter_cv}: must be in [0, 1)")
        cluster = cluster.replace(jitter_cv=args.jitter_cv)
    if args.precision is not None and not cluster.device.is_gpu:
        raise UsageError("--precision applies to GPU clusters (an estimated profile)")
    try:
        strategy = BuildStrategy(reduce_strategy=args.reduce_strategy,
                                 fuse_all_reduce_ops=True if args.fuse_bucket_mb else None,
                                 fuse_bucket_mb=args.fuse_bucket_mb or 25.0,
                                 allreduce_dtype=args.allreduce_dtype,
                                 gradient_accumulation_steps=args.accumulate,
                                 **zero_settings(args))
    except SSAExecError as e:
        raise UsageError(str(e)) from None
    profile = _profile(args, program, cluster)
    layouts = sim.LAYOUTS if args.layout == "both" else (args.layout,)
    graphs = {"both": (False, True), "on": (True,), "off": (False,)}[args.cuda_graph]
    predictions = sim.scaling(program, profile, cluster, gpus, layouts, graphs, strategy,
                              algorithm=args.algorithm, input_pipeline=args.input)
    sweeps = {}
    if args.sweep == "bucket-mb":
        best, sizes = report.best_per_size(predictions), _sizes(args.bucket_sizes)
        for n in gpus:
            b = best[n]
            sweeps[n] = sim.sweep_bucket_mb(program, profile, cluster, n, sizes, b.layout,
                                            strategy, cuda_graph=b.cuda_graph,
                                            algorithm=args.algorithm,
                                            input_pipeline=args.input)
    memory = _memory(program, strategy, gpus, profile, args) if args.zero else {}
    plot = None
    if not args.no_plot:
        stem = args.model or Path(args.program).name.split(".")[0]
        plot = args.plot or f"{stem}.{cluster.name}.simulate.png"
        try:
            report.plot_scaling(predictions, plot, f"{args.program} on {cluster.name}, batch "
                                                   f"{profile.batch} per GPU")
        except OSError as e:
            raise UsageError(f"{plot}: cannot write the plot: {e.strerror or e}") from None
    if args.json:
        import json
        doc = report.scaling_json(predictions, args.program, cluster, profile, sweeps)
        doc["plot"] = plot
        if memory:
            doc["memory"] = {str(n): m.to_dict() for n, m in memory.items()}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return EXIT_OK
    sys.stdout.write(report.format_scaling(predictions, args.program, cluster, profile))
    if memory:
        from ..sim.memory import format_memory
        for n, m in memory.items():
            sys.stdout.write("\n" + format_memory(m, f" = {n} GPUs"))
    for n, rows in sweeps.items():
        sys.stdout.write("\n" + report.format_sweep(rows, n))
    if plot:
        sys.stdout.write(f"\nwrote {plot}\n")
    return EXIT_OK
