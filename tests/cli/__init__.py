"""Tests of ssaexec/cli/."""
