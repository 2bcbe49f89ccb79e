"""Tests of ssaexec/state/."""
