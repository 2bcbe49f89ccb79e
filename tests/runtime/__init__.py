"""Tests of ssaexec/runtime/."""
