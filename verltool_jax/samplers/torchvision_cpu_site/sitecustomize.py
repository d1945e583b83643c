"""Started with this folder on PYTHONPATH (``verltool_jax.samplers.torchvision_cpu.enable``
puts it there for the processes vLLM starts), an interpreter declares torchvision's
unguarded op schemas right before torchvision is first imported. Nothing is imported at
start-up beyond the hook itself."""

from verltool_jax.samplers.torchvision_cpu import install_import_hook

install_import_hook()
