"""The ground floor: errors, dtypes, places, limits, strategies, the torch door.

Imports nothing of ssaexec but ``core.errors``; everything else may import it."""
