"""Tests of tool_server (fixtures shared with other folders come from tests/support)."""
