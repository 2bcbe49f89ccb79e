"""Tests of ssaexec/core/."""
