"""GPT/MoE pretraining on megatron-core with layer-wise gradient sync.

Importing the package prepares megatron-core for this machine (see `platform`), so it must be
imported before megatron.core itself.
"""

from megatron_lgs.platform import install as _install_platform

_install_platform()
