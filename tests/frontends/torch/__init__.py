"""Tests of ssaexec/frontends/torch/."""
