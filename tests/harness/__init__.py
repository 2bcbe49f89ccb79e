"""Tests of ssaexec/harness/."""
