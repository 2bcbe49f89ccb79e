"""Tests of ssaexec/ops/."""
