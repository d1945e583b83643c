"""Tests of launch/ (dry runs of every script, the local multi-process launcher)."""
