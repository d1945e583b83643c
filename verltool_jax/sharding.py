"""Device mesh, partition rules and multi-host start-up.

Mesh axes: ``data`` (pure data parallel: params replicated), ``fsdp`` (data parallel with
params sharded, ZeRO-3 style) and ``tp`` (tensor parallel inside a layer). Activations
are split over the batch on ``("data", "fsdp")``. Parameters follow ``PARAM_RULES`` (the
first regex matching the ``/``-joined parameter path wins); a dimension that the mesh
axis does not divide is left unsplit on that axis (``spec_for_shape``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tp")
BATCH_AXES = ("data", "fsdp")

# (regex on "a/b/c" parameter path, spec). Kernels are [in, out]: column-parallel
# projections split out over tp, row-parallel ones split in over tp; fsdp takes the other dim.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"(^|/)embed/embedding$", P("tp", "fsdp")),  # [V, H]
    (r"attn/(q|k|v)_proj/kernel$", P("fsdp", "tp")),  # [H, heads*D]
    (r"attn/(q|k|v)_proj/bias$", P("tp")),
    (r"attn/o_proj/kernel$", P("tp", "fsdp")),  # [heads*D, H]
    (r"attn/o_proj/bias$", P()),
    (r"mlp/(gate|up)_proj/kernel$", P("fsdp", "tp")),  # [H, I]
    (r"mlp/down_proj/kernel$", P("tp", "fsdp")),  # [I, H]
    (r"(^|/)lm_head/kernel$", P("fsdp", "tp")),  # [H, V]
    (r"(^|/)value_head/kernel$", P("fsdp", None)),  # [H, 1] the critic's head (models.value)
    (r"(^|/)value_head/bias$", P()),
    (r"norm/weight$", P()),  # RMSNorm scales
    # vision tower (Qwen2.5-VL / Qwen2-VL): the same column / row split as the decoder
    (r"visual/patch_embed/kernel$", P("fsdp", "tp")),  # [patch_dim, W]
    (r"attn/qkv/kernel$", P("fsdp", "tp")),  # [W, 3W]
    (r"attn/qkv/bias$", P("tp")),
    (r"attn/proj/kernel$", P("tp", "fsdp")),  # [W, W]
    (r"mlp/(gate|up)_proj/bias$", P("tp")),
    (r"mlp/down_proj/bias$", P()),
    (r"mlp/fc1/kernel$", P("fsdp", "tp")),
    (r"mlp/fc1/bias$", P("tp")),
    (r"mlp/fc2/kernel$", P("tp", "fsdp")),
    (r"merger/mlp_in/kernel$", P("fsdp", "tp")),  # [4W, 4W]
    (r"merger/mlp_in/bias$", P("tp")),
    (r"merger/mlp_out/kernel$", P("tp", "fsdp")),  # [4W, H]
    (r"(attn/proj|mlp/fc2|merger/mlp_out)/bias$", P()),
    (r"(norm1|norm2|ln_q)/(weight|scale|bias)$", P()),  # vision RMS/LayerNorms
)


def make_mesh(mesh_shape: Sequence[int] = (1, -1, 1), devices: Sequence | None = None) -> Mesh:
    """A ``Mesh`` with axes ``(data, fsdp, tp)`` of ``mesh_shape``; one entry may be -1 (= the rest).

    Uses every device of every process unless ``devices`` is given. Axis types are Auto
    (GSPMD propagation from jit in/out shardings and sharding constraints).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = list(mesh_shape)
    if len(shape) != 3:
        raise ValueError(f"mesh_shape must be (data, fsdp, tp), got {mesh_shape!r}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh_shape may contain at most one -1, got {mesh_shape!r}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if len(devices) % known:
            raise ValueError(f"mesh_shape {mesh_shape} does not divide {len(devices)} devices")
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"mesh_shape {tuple(shape)} needs {int(np.prod(shape))} devices, "
            f"have {len(devices)}; change mesh_shape (one entry may be -1)"
        )
    return jax.make_mesh(tuple(shape), AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def _axis_size(mesh, axis) -> int:
    names = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh.shape[n] for n in names]))


def spec_for_shape(spec: P, shape: Sequence[int], mesh) -> P:
    """``spec`` with every axis that does not divide its dimension replaced by None."""
    out = []
    for i, dim in enumerate(shape):
        ax = spec[i] if i < len(spec) else None
        out.append(ax if ax is not None and dim % _axis_size(mesh, ax) == 0 else None)
    return P(*out)


def path_str(path: Sequence[Any]) -> str:
    """``"layers/0/attn/q_proj/kernel"`` from a jax key path or an nnx path tuple (the
    ``.value`` attribute of an ``nnx.Variable`` is dropped)."""
    parts = []
    for p in path:
        if isinstance(p, jax.tree_util.DictKey):
            parts.append(str(p.key))
        elif isinstance(p, jax.tree_util.SequenceKey):
            parts.append(str(p.idx))
        elif isinstance(p, jax.tree_util.GetAttrKey):
            if p.name != "value":
                parts.append(p.name)
        else:
            parts.append(str(p))
    return "/".join(parts)


def param_spec(
    path: Sequence[Any] | str,
    shape: Sequence[int],
    mesh,
    rules: Sequence[tuple[str, P]] = PARAM_RULES,
) -> P:
    """The PartitionSpec of one parameter; raises if no rule names it."""
    name = path if isinstance(path, str) else path_str(path)
    for pattern, spec in rules:
        if re.search(pattern, name):
            return spec_for_shape(spec, shape, mesh)
    raise ValueError(
        f"no partition rule matches parameter {name!r}; add one to "
        f"verltool_jax.sharding.PARAM_RULES"
    )


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a ``[B, ...]`` batch array: batch over ``(data, fsdp)``."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def constrain_activations(x):
    """Constrain ``x [B, ...]`` to batch-over-(data, fsdp) when a mesh with those axes is set
    (``jax.set_mesh``) and divides B; otherwise return ``x`` unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not all(a in mesh.axis_names for a in BATCH_AXES):
        return x
    if x.shape[0] % _axis_size(mesh, BATCH_AXES):
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *([None] * (x.ndim - 1))))


# ------------------------------------------------------------------ multi-host
def distributed_init_kwargs(env: Mapping[str, str] | None = None) -> dict | None:
    """What ``jax.distributed.initialize`` needs in this environment, or None (one process).

    * Explicit: ``JAX_COORDINATOR_ADDRESS`` (host:port), ``JAX_NUM_PROCESSES``,
      ``JAX_PROCESS_ID`` (and optional ``JAX_LOCAL_DEVICE_IDS``, comma separated).
    * SLURM job with ``SLURM_NTASKS`` > 1 and TPU pods (``TPU_WORKER_HOSTNAMES`` with more
      than one host, or ``MEGASCALE_COORDINATOR_ADDRESS``): ``{}`` -- jax detects the cluster.
    """
    env = os.environ if env is None else env
    addr = env.get("JAX_COORDINATOR_ADDRESS")
    if addr:
        try:
            kw: dict[str, Any] = dict(
                coordinator_address=addr,
                num_processes=int(env["JAX_NUM_PROCESSES"]),
                process_id=int(env["JAX_PROCESS_ID"]),
            )
        except KeyError as e:
            raise ValueError(
                f"JAX_COORDINATOR_ADDRESS is set but {e.args[0]} is not; set "
                "JAX_NUM_PROCESSES and JAX_PROCESS_ID too"
            ) from None
        if env.get("JAX_LOCAL_DEVICE_IDS"):
            kw["local_device_ids"] = [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")]
        return kw
    if env.get("SLURM_JOB_ID") and int(env.get("SLURM_NTASKS", "1")) > 1:
        return {}
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if len(hosts) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return {}
    return None


def init_distributed(env: Mapping[str, str] | None = None) -> bool:
    """Start ``jax.distributed`` when the environment describes several processes.

    Call once per process before anything touches devices. Returns True when it
    initialised (``jax.process_count()`` is then the number of hosts), False for a
    single-process run.
    """
    kw = distributed_init_kwargs(env)
    if kw is None:
        return False
    jax.distributed.initialize(**kw)
    return True
