import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


# make test-inductor (SSAEXEC_COMPILER=inductor: every ExecutionStrategy compiles its
# segments with Inductor): the tests that cannot hold then, each with why. Keys are node
# id prefixes.
INDUCTOR_EXCEPTIONS = {
    "tests/test_checkpoint.py::test_resume_equals_training_straight_through":
        "bit for bit: the resumed run records its first step uncompiled where the straight "
        "run is compiled; fused kernels round the last bit differently",
    "tests/test_eval.py::test_an_eval_executor_sees_the_running_statistics_trained_after":
        "bit for bit against an executor that compiles on other steps (last-bit rounding)",
    "tests/test_inductor.py": "compares the compiler with the compiled path: needs both",
}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SSAEXEC_COMPILER") == "inductor":
        for item in items:
            why = next((w for k, w in INDUCTOR_EXCEPTIONS.items()
                        if item.nodeid.startswith(k)), None)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=f"under SSAEXEC_COMPILER: {why}"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch sees no GPU on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
