import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch sees no GPU on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
