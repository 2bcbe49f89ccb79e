"""Tests of ssaexec/sim/."""
