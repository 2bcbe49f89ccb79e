"""Tests of ssaexec/frontends/paddle/."""
