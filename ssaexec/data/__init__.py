"""Feeds: their policy, the background loaders, feed files, synthetic data."""
