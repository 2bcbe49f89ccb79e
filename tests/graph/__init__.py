"""Tests of ssaexec/graph/."""
