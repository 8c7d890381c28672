# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Binds the DeepSeek V4.1 Blackwell fork into the installed vLLM.

vLLM's plugin loader calls :func:`register` in every process (API server,
engine core, workers) through the ``vllm.general_plugins`` entry point, so a
stock ``vllm serve`` picks the fork up with no extra flag.
"""

import vllm
from vllm.logger import init_logger
from vllm.plugins.deepseek_v4_1_blackwell.pin import VLLM_VERSION

logger = init_logger(__name__)

_registered = False


def register() -> bool:
    """Bind the fork into vLLM once per process.

    Returns True when the fork is active. On any vLLM other than the pinned
    release it binds nothing and logs why: the hooks patch functions whose
    shape is only known for that release.
    """
    global _registered
    if _registered:
        return True
    if vllm.__version__ != VLLM_VERSION:
        logger.warning(
            "DeepSeek V4.1 Blackwell fork not activated: it was written for "
            "vLLM %s but vLLM %s is installed. Install the fork wheel built "
            "for this vLLM, or uninstall it.",
            VLLM_VERSION,
            vllm.__version__,
        )
        return False
    # Imported here so that a version mismatch never imports code that
    # assumes the pinned upstream's module layout.
    from vllm.plugins.deepseek_v4_1_blackwell import hooks

    hooks.install()
    _registered = True
    logger.info("DeepSeek V4.1 Blackwell fork active (vLLM %s).", VLLM_VERSION)
    return True
