"""Regenerate the example program files: ``python examples/make_examples.py``.

Each model from ``ssaexec.program.example_models`` is written as its main program
(``NAME.json``) and its startup program (``NAME.startup.json``, the
parameter initialisers ``ssaexec run`` and ``ssaexec trace`` pick up
automatically). The two small seed programs are also written in the text form
(``NAME.ssa`` + ``NAME.startup.ssa``) to show it and to keep it tested.
Building is deterministic (fixed seeds, program-local name counters), so
running this again reproduces the files byte for byte.
"""

import argparse
from pathlib import Path

from ssaexec.program.example_models import (
    build_mlp, build_resnet, build_seed_mlp, build_uci_housing, build_uci_housing_pserver,
    make_optimizer
)
from ssaexec.program.io import save_program

HERE = Path(__file__).resolve().parent

# name -> (builder, text form too?, what it is)
EXAMPLES = {
    "uci_housing": (lambda: build_uci_housing(optimizer=make_optimizer("sgd", 0.01)), True,
                    "fit-a-line: fc(13 -> 1) regression with squared error, SGD"),
    "uci_housing_pserver": (lambda: build_uci_housing_pserver(
        optimizer=make_optimizer("sgd", 0.01)), False,
        "seed 002's example: uci_housing with its optimizer in a PlaceableBlock (se.transpile, "
        "ssaexec launch)"),
    "seed_mlp": (lambda: build_seed_mlp(optimizer=make_optimizer("sgd", 0.01)), True,
                 "the seed document's fc(784 -> 100) -> fc(10) softmax + cross entropy, SGD"),
    "mnist_mlp": (lambda: build_mlp(hidden=(128, 64),
                                    optimizer=make_optimizer("momentum", 0.05, momentum=0.9)),
                  False, "MLP on MNIST-shaped data: 784 -> 128 -> 64 -> 10, ReLU, momentum"),
    "small_resnet": (lambda: build_resnet(18, image_size=32, base=8,
                                          optimizer=make_optimizer("momentum", 0.05,
                                                                   momentum=0.9)),
                     False, "ResNet-18 layout on 32x32x3 images with 8 base channels, momentum"),
}


def write(out_dir=HERE, names=None):
    """Write the example files into ``out_dir``; return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (build, text_too, _) in EXAMPLES.items():
        if names and name not in names:
            continue
        main, startup, _ = build()
        main.validate()
        startup.validate()
        suffixes = (".json", ".ssa") if text_too else (".json",)
        for suffix in suffixes:
            written.append(save_program(main, out_dir / f"{name}{suffix}"))
            written.append(save_program(startup, out_dir / f"{name}.startup{suffix}"))
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"examples to write (default: all of "
                                             f"{', '.join(EXAMPLES)})")
    ap.add_argument("-o", "--out-dir", default=str(HERE), help="directory (default: examples/)")
    args = ap.parse_args()
    for path in write(args.out_dir, args.names):
        print(path)
