"""Tests of ssaexec/data/."""
