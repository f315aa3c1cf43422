"""Thin CLIs: one configuration in, one JSON record out (see `cs336_systems.records`)."""
