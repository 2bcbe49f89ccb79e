"""Tests of ssaexec/frontends/."""
