"""Tests of rollout (fixtures shared with other folders come from tests/support)."""
