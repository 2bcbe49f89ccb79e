"""The test suite; tests/<folder>/ mirrors ssaexec/<folder>/."""
