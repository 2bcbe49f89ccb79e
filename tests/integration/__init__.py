"""End-to-end tests across layers: the command line, real processes, hostile files."""
