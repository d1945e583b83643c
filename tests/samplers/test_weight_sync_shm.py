"""Shared-memory weight segments of processes that have exited are removed (a killed
trainer never reaches SharedWeightBuffer.close)."""

from __future__ import annotations

import os
import subprocess
import sys

from verltool_jax.samplers.weight_sync import remove_orphaned_segments


def test_segments_of_exited_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mine = os.getpid()
    for name in (
        f"verltool-w-{dead}-abcd1234-0",
        f"verltool-w-{mine}-abcd1234-0",
        "verltool-w-notapid-0",
        "other-file",
    ):
        (tmp_path / name).write_bytes(b"x" * 16)
    removed = remove_orphaned_segments(str(tmp_path))
    assert [os.path.basename(p) for p in removed] == [f"verltool-w-{dead}-abcd1234-0"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"verltool-w-{mine}-abcd1234-0", "verltool-w-notapid-0", "other-file"]
    )


def _named(rng, flax_kernels=True):
    """A small HF-named set like the trainer's: Flax ``[in, out]`` kernels seen in HF
    layout (transposed views), fusable q/k/v, a bias and a norm."""
    import numpy as np

    def kernel(i, o):
        k = rng.normal(size=(i, o)).astype(np.float32)
        return k.T if flax_kernels else np.ascontiguousarray(k.T)

    p = "model.layers.0"
    return [
        ("model.embed_tokens.weight", rng.normal(size=(32, 8)).astype(np.float32)),
        (f"{p}.self_attn.q_proj.weight", kernel(8, 8)),
        (f"{p}.self_attn.k_proj.weight", kernel(8, 4)),
        (f"{p}.self_attn.v_proj.weight", kernel(8, 4)),
        (f"{p}.self_attn.q_proj.bias", rng.normal(size=(8,)).astype(np.float32)),
        (f"{p}.self_attn.k_proj.bias", rng.normal(size=(4,)).astype(np.float32)),
        (f"{p}.self_attn.v_proj.bias", rng.normal(size=(4,)).astype(np.float32)),
        (f"{p}.self_attn.o_proj.weight", kernel(8, 8)),
        (f"{p}.input_layernorm.weight", np.ones(8, np.float32)),
    ]


def _entries(manifest):
    import json

    return [row[0] for bucket in json.loads(manifest) for row in bucket["tensors"]]


def _loaded(manifest):
    """``{hf name: array}`` an engine loading ``manifest`` gets (numpy views of the shm)."""
    import json
    import mmap

    import numpy as np

    from verltool_jax.samplers.weight_sync import _np_dtype

    out = {}
    for bucket in json.loads(manifest):
        with open(bucket["path"], "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for name, dt, shape, off, layout, parts in bucket["tensors"]:
            stored = shape[::-1] if layout == "t" else shape
            n = int(np.prod(shape))
            a = np.frombuffer(mm, _np_dtype(dt), count=n, offset=off).reshape(stored)
            full = a.T if layout == "t" else a
            row = 0
            for part, rows in parts or [[name, shape[0]]]:
                out[part] = np.array(full[row : row + rows])
                row += rows
    return out


def test_an_unchanged_tensor_is_skipped_only_when_its_bytes_are_equal():
    """After a full write, a skipping write sends exactly the entries with a changed byte:
    one element one ulp up, a 0.0 turned -0.0 (equal as floats, not as bits), one part of a
    fused q/k/v (the whole fused entry goes). Every skipped tensor's new bytes equal the
    old ones, and the full manifest always reads back the newest values of every tensor."""
    import numpy as np

    from verltool_jax.samplers.weight_sync import SharedWeightBuffer

    rng = np.random.default_rng(0)
    first = _named(rng)
    buf = SharedWeightBuffer(bucket_bytes=1024)  # several buckets
    try:
        full = buf.write(first)
        assert buf.skipped == [] and buf.written_bytes == buf.nbytes
        names = dict(first)
        # the same arrays again: nothing to send
        assert _entries(buf.write(first, skip_unchanged=True)) == []
        assert buf.written_bytes == 0 and len(buf.skipped) == len(_entries(full))
        norm = np.zeros(8, np.float32)
        buf.write(list({**names, "model.layers.0.input_layernorm.weight": norm}.items()))
        second = dict(first)
        emb = names["model.embed_tokens.weight"].copy()
        emb[3, 5] = np.nextafter(emb[3, 5], np.float32(np.inf))  # one ulp
        second["model.embed_tokens.weight"] = emb
        second["model.layers.0.input_layernorm.weight"] = -norm  # -0.0: other bits
        k = names["model.layers.0.self_attn.k_proj.weight"]
        second["model.layers.0.self_attn.k_proj.weight"] = (k.T * 1.5).T  # still a view
        sent = _entries(buf.write(list(second.items()), skip_unchanged=True))
        assert sorted(sent) == [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.qkv_proj.weight",
        ]
        assert sorted(buf.skipped) == sorted(set(_entries(full)) - set(sent))
        got = _loaded(buf.full_manifest)
        for name, a in second.items():
            assert got[name].tobytes() == np.ascontiguousarray(a).tobytes(), name
        # a skipping write with another layout (the checkpoint's [out, in]) writes all
        other = [(n, np.ascontiguousarray(a)) for n, a in second.items()]
        assert sorted(_entries(buf.write(other, skip_unchanged=True))) == sorted(_entries(full))
    finally:
        buf.close()


def test_frozen_tensors_are_spot_checked_and_a_broken_promise_still_sent():
    """``frozen`` names (the base under LoRA) are compared on their first rows only: one
    changed past them is trusted unchanged (the caller's promise; nothing else reads it),
    one changed in its first row is sent anyway, and a changed tensor not named frozen is
    compared in full as before. A fused entry is trusted only when all its parts are."""
    import numpy as np

    from verltool_jax.samplers.weight_sync import SharedWeightBuffer

    rng = np.random.default_rng(1)
    first = dict(_named(rng))
    big = rng.normal(size=(4096, 8)).astype(np.float32)  # many more rows than a spot check
    first["lm_head.weight"] = big
    buf = SharedWeightBuffer(bucket_bytes=1 << 20)
    try:
        buf.write(list(first.items()))
        second = dict(first)
        late = big.copy()
        late[-1, -1] += 1.0  # past the spot check
        second["lm_head.weight"] = late
        emb = first["model.embed_tokens.weight"].copy()
        emb[0, 0] += 1.0  # in the first row: the guard sees it
        second["model.embed_tokens.weight"] = emb
        norm = first["model.layers.0.input_layernorm.weight"].copy()
        norm[-1] = 2.0  # not frozen: compared in full
        second["model.layers.0.input_layernorm.weight"] = norm
        frozen = set(first) - {"model.layers.0.input_layernorm.weight"}
        frozen.discard("model.layers.0.self_attn.k_proj.weight")  # one part of q/k/v
        sent = _entries(buf.write(list(second.items()), skip_unchanged=True, frozen=frozen))
        assert sorted(sent) == [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
        ]
        assert "lm_head.weight" in buf.trusted
        assert "model.layers.0.self_attn.qkv_proj.weight" in buf.skipped
        assert "model.layers.0.self_attn.qkv_proj.weight" not in buf.trusted
        assert set(buf.trusted) <= set(buf.skipped)
        # without the promise the late change is found and sent
        assert "lm_head.weight" in _entries(buf.write(list(second.items()), skip_unchanged=True))
    finally:
        buf.close()


def test_same_bits_compares_after_the_cast_and_stops_at_the_first_difference():
    import ml_dtypes
    import numpy as np

    from verltool_jax.samplers import weight_sync
    from verltool_jax.samplers.weight_sync import same_bits

    x = np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)
    slot = x.astype(ml_dtypes.bfloat16)
    assert same_bits(slot, x)  # the cast the write does, then equal
    y = x.copy()
    y[63, 63] = 2.0
    assert not same_bits(slot, y)  # a difference in the last chunk
    nan = np.full(3, np.nan, np.float32)
    assert same_bits(nan.copy(), nan) and not same_bits(np.zeros(3, np.float32), -np.zeros(3))
    assert not same_bits(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    # a spot check: only the leading rows holding about max_elements elements
    assert same_bits(slot, y, max_elements=64) and not same_bits(slot, y, max_elements=4096)
    z = x.copy()
    z[0, 1] = 2.0
    assert not same_bits(slot, z, max_elements=1)  # at least the first row
    old = weight_sync._COMPARE_CHUNK
    try:  # small chunks: the same answers row block by row block
        weight_sync._COMPARE_CHUNK = 64
        assert same_bits(slot, x) and not same_bits(slot, y)
    finally:
        weight_sync._COMPARE_CHUNK = old
