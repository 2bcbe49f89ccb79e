"""Tests of ssaexec/execution/."""
