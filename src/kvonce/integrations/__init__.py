"""Adapters to the stacks users run; each imports its peer lazily."""
