"""Tests of models (fixtures shared with other folders come from tests/support)."""
