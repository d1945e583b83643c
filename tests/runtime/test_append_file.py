"""Append-only line files after a crash: a torn last line is dropped, never glued to."""

from __future__ import annotations

import json

from verltool_jax.reporting.metrics_writer import MetricsWriter, read_metrics
from verltool_jax.runtime.append_file import drop_torn_tail, open_for_append


def test_drop_torn_tail_keeps_whole_lines_only(tmp_path):
    p = tmp_path / "x.jsonl"
    assert drop_torn_tail(p) == 0  # missing
    p.write_bytes(b"")
    assert drop_torn_tail(p) == 0
    p.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    assert drop_torn_tail(p) == 0 and p.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    p.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": 3, "d"')
    assert drop_torn_tail(p) == len(b'{"c": 3, "d"')
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    p.write_bytes(b"no newline at all")
    assert drop_torn_tail(p) == 17 and p.read_bytes() == b""
    big = b"x" * 200_000  # a torn line longer than one read block
    p.write_bytes(b"keep\n" + big)
    assert drop_torn_tail(p) == len(big) and p.read_bytes() == b"keep\n"
    with open_for_append(p) as f:
        f.write("next\n")
    assert p.read_bytes() == b"keep\nnext\n"


def test_a_resumed_metrics_writer_loses_only_the_torn_record(tmp_path):
    """A run died (full disk) mid-record; the resumed run's first record must survive."""
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"reward": 0.5})
        w.write(2, {"reward": 0.6})
    path = tmp_path / "metrics.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + json.dumps({"step": 3, "reward": 0.7}).encode()[:15])
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(3, {"reward": 0.7})
    assert [(r["step"], r["reward"]) for r in read_metrics(path)] == [
        (1, 0.5),
        (2, 0.6),
        (3, 0.7),
    ]
    assert all(json.loads(line) for line in path.read_text().splitlines())
