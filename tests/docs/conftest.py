"""Tests of the documentation (README.md, DEVELOPERS.md, launch/README.md, docs/)."""
