"""Tests of ssaexec/dist/."""
