"""``ssaexec stats``: sizes, critical path, width, traffic and memory of a program's SSA graph.

The numbers come from ``ssaexec.graph.analysis.graph_stats`` (static: nothing
runs) plus ``ssaexec.runtime.compiled.compile_summary`` (the compiled runner's own
step plan, ``runtime.plan``: the segments it runs, in its order; how the places of a
process run, ``runtime.places_rule.describe``; with
``--compiler inductor``, ``inductor_summary``, the Inductor runner's); this module
only picks the output form. ``--zero STAGE`` adds ``ssaexec.sim.memory``'s per-device
peak for a world of ``--places`` x ``--processes`` ranks.
"""

import sys

from .common import (DEFAULT_STATIC_PLACES, EXIT_OK, UsageError, graph_of, graph_options,
                     positive, zero_settings)

__all__ = ["register"]

EPILOG = """\
critical path: the longest chain of dependent op handles, in ops.
max width: the most handles at one level of the as-soon-as-possible schedule,
and the largest set of mutually independent handles (how many could run at
once; exact, by Dilworth's theorem). Traffic: bytes each place sends per step
with ring algorithms: all-reduce 2(n-1)/n x payload, reduce and broadcast
(n-1)/n x payload. Memory: parameters, gradients, other persistables.
--zero STAGE: each device's predicted peak under ZeRO (the simulator's formula,
docs/simulator.md): parameters, gradients and optimizer state sharded by stage,
gathered parameters (stage 3, --zero-prefetch), activations at --batch.

examples:
  ssaexec stats examples/small_resnet.json --places 4
  ssaexec stats examples/seed_mlp.json --reduce-strategy reduce --format json
  ssaexec stats examples/mnist_mlp.json --places 1 --compiler inductor
  ssaexec stats examples/small_resnet.json --places 4 --processes 2 --zero 3 --batch 32
"""


def register(add):
    """Add the ``stats`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("stats", "print statistics of the SSA graph of a program", EPILOG,
            [graph_options(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text",
                   help="output form (default: %(default)s)")
    p.add_argument("--compiler", choices=("auto", "inductor"), default=None,
                   help="also say what this compiler would compile: its segments, and those "
                        "that would run uncompiled, with why (auto, the library's default, "
                        "compiles the same segments as inductor, in the background; "
                        "default: say nothing about a compiler)")
    z = p.add_argument_group("memory under ZeRO (sim.memory, the simulator's formula)")
    z.add_argument("--processes", type=positive, default=1, metavar="N",
                   help="processes of the run, each with --places places (default 1)")
    z.add_argument("--batch", "-b", type=positive, default=1,
                   help="samples per device for the activations (default 1)")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args):
    from ..graph.analysis import format_stats, graph_stats
    from ..runtime.compiled import compile_summary
    from ..runtime.cuda_graph import capture_problem
    from ..runtime.nccl import choose_local_collective
    zero = zero_settings(args)
    if zero:  # the graph of the stage (its gathers, reduce-scatters, frees), per process
        zero["num_trainers"] = args.processes
    graph = graph_of(args, **zero)
    stats = graph_stats(graph)
    problem = capture_problem(graph)
    stats["cuda_graph"] = {"capturable": problem is None, "why_not": None if problem is None
                           else f"op #{problem[0].op_index} '{problem[0].op_type}': {problem[1]}"}
    stats["collective_backend"] = choose_local_collective(graph.places)[2]
    from ..runtime.places_rule import describe
    stats["places_mode"] = describe(graph.places, args.processes)  # threads or turns, why
    if args.compiler in ("inductor", "auto"):
        from ..runtime.inductor import inductor_summary
        # the Inductor runner's own graph: under a compiler the gradients go in buckets
        # ("auto" tiers the Inductor runner: the same segments, compiled in the background)
        stats["compiler"] = inductor_summary(graph_of(args, compiler=args.compiler))
        stats["compiler"]["name"] = args.compiler
    stats["compiled"] = compile_summary(graph)
    memory = None
    if args.zero is not None:
        from ..core.errors import SSAExecError
        from ..sim.memory import predict_memory
        from .common import load_program_file
        world = len(graph.places) * args.processes
        try:  # of the plain program, in the run order of the stage's graph
            memory = predict_memory(load_program_file(args.program), world, args.zero,
                                    batch=args.batch,
                                    prefetch=args.zero_prefetch,
                                    reshard_after_forward=args.reshard,
                                    gather_dtype=args.zero_gather_dtype, graph=graph)
        except SSAExecError as e:
            raise UsageError(str(e)) from None
        stats["zero_memory"] = dict(memory.to_dict(), places=len(graph.places),
                                    processes=args.processes)
    if args.format == "json":
        import json
        stats = dict(stats, program=args.program)
        sys.stdout.write(json.dumps(stats, indent=1) + "\n")
    else:
        sys.stdout.write(format_stats(stats, args.program))
        cg = stats["cuda_graph"]
        sys.stdout.write("cuda graph: " + ("the step can be captured "
                                           "(ExecutionStrategy(cuda_graph=True))"
                                           if cg["capturable"] else
                                           f"not capturable: {cg['why_not']}") + "\n")
        sys.stdout.write(stats["collective_backend"] + "\n")
        sys.stdout.write(f"places run      {stats['places_mode']}\n")
        comp = stats.get("compiler")
        if comp is not None:
            sys.stdout.write(f"compiler        {comp['name']}: {comp['segments']} segments "
                             f"({comp['commit_segments']} in the commit phase), "
                             f"{len(comp['uncompiled'])} to run uncompiled\n")
            for u in comp["uncompiled"]:
                sys.stdout.write(f"  uncompiled    {u['segment']}: {u['why']}\n")
        if memory is not None:
            from ..sim.memory import format_memory
            procs = f"{args.processes} process" + ("es" if args.processes > 1 else "")
            sys.stdout.write(format_memory(
                memory, f" = {len(graph.places)} places x {procs}"))
    return EXIT_OK
