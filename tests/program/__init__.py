"""Tests of ssaexec/program/."""
