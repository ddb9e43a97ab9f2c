"""Synthetic tasks for accuracy comparisons (registered through `register_tasks`)."""
