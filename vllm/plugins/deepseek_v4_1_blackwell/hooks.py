# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The places where upstream vLLM 0.30.0 has no extension point.

Each binding here becomes a small in-place edit in the upstream pull request
(docs/upstream-pr.md lists them). Every binding is idempotent and checks that
the upstream object it replaces still has the shape it was written for, so an
upstream change fails loudly (at registration, or at the import of the model
module it binds into) instead of silently unbinding.
"""

import functools
import inspect
from collections.abc import Callable

from vllm.logger import init_logger
from vllm.plugins.deepseek_v4_1_blackwell.after_import import after_import

logger = init_logger(__name__)

FORK_BACKEND = (
    "vllm.models.deepseek_v4_1.nvidia.flashinfer_sparse."
    "DeepseekV4FlashInferMLASparseBackend"
)
# Marks a function this module already wrapped.
_WRAPPED = "_dsv41_blackwell_wrapped"


class UpstreamShapeChanged(RuntimeError):
    """Upstream no longer has the shape a binding was written for."""


def bind_backend_name() -> None:
    """``--attention-backend FLASHINFER_MLA_SPARSE_DSV41`` resolves to the
    fork's backend (upstream: vllm/v1/attention/backends/registry.py)."""
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    member = getattr(AttentionBackendEnum, "FLASHINFER_MLA_SPARSE_DSV41", None)
    if member is None:
        raise UpstreamShapeChanged(
            "AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV41 is gone"
        )
    register_backend(member, FORK_BACKEND)


def fork_attention_classes() -> dict[type, type]:
    """Upstream DeepSeek V4.1 FlashInfer attention class -> the fork's."""
    from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as fork
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as upstream

    return {
        upstream.DeepseekV4FlashInferSM120Attention: (
            fork.DeepseekV4FlashInferSM120Attention
        ),
        upstream.DeepseekV4FlashInferMLAAttention: (
            fork.DeepseekV4FlashInferMLAAttention
        ),
    }


def fork_attention_class(chosen: type) -> type:
    """The fork's class for upstream's choice on this GPU.

    Upstream picks the TRTLLM-gen class for every GPU but SM12x; off SM10x
    the fork runs the two-segment class instead (on the Triton kernel).
    """
    from vllm.platforms import current_platform

    replacement = fork_attention_classes().get(chosen)
    capability = current_platform.get_device_capability()
    if replacement is None or capability is None:
        return replacement or chosen
    # Upstream choosing either FlashInfer class means "this backend"; which of
    # the fork's classes runs it depends on the GPU.
    from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as fork

    return fork.attention_class_for(capability)


def bind_attention_selection() -> None:
    """DeepSeek V4.1 layers build the fork's FlashInfer attention classes
    (upstream: ``_select_dsv4_attn_cls`` in
    vllm/models/deepseek_v41/nvidia/model.py)."""
    from vllm.models.deepseek_v41.nvidia import model

    select = getattr(model, "_select_dsv4_attn_cls", None)
    if select is None or list(inspect.signature(select).parameters) != ["vllm_config"]:
        raise UpstreamShapeChanged(
            "vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls "
            "no longer takes (vllm_config)"
        )
    if getattr(select, _WRAPPED, False):
        return

    @functools.wraps(select)
    def select_with_fork(vllm_config) -> type:
        return fork_attention_class(select(vllm_config))

    setattr(select_with_fork, _WRAPPED, True)
    model._select_dsv4_attn_cls = select_with_fork


def bind_sparse_mla_launcher() -> None:
    """Upstream's DeepSeek V4.1 layers call the launcher that runs the kernel
    the policy chose (upstream: the module-level
    ``flashinfer_trtllm_batch_decode_sparse_mla_dsv4`` name in
    vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py)."""
    from vllm.models.deepseek_v4_1.nvidia.sparse_mla_launcher import make_launcher
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as upstream

    name = "flashinfer_trtllm_batch_decode_sparse_mla_dsv4"
    launcher = getattr(upstream, name, None)
    if not callable(launcher):
        raise UpstreamShapeChanged(f"{upstream.__name__}.{name} is gone")
    if getattr(launcher, _WRAPPED, False):
        return
    wrapped = make_launcher(launcher)
    setattr(wrapped, _WRAPPED, True)
    setattr(upstream, name, wrapped)


def bind_sm120_config_probe() -> None:
    """Upstream's SM120 layer asks the page policy, not FlashInfer's private
    table, whether its shape is served (upstream:
    ``has_flashinfer_sparse_mla_sm120_config`` in vllm/utils/flashinfer.py,
    called only by ``DeepseekV4FlashInferSM120Attention.__init__``).

    The fork's layers negotiate before upstream's constructor runs, and every
    shape the policy accepts has a kernel (FlashInfer's or the Triton one).
    """
    from vllm.utils import flashinfer as flashinfer_utils

    name = "has_flashinfer_sparse_mla_sm120_config"
    probe = getattr(flashinfer_utils, name, None)
    if probe is None or list(inspect.signature(probe).parameters) != [
        "num_q_heads",
        "top_k",
    ]:
        raise UpstreamShapeChanged(
            f"vllm.utils.flashinfer.{name} no longer takes (num_q_heads, top_k)"
        )
    if getattr(probe, _WRAPPED, False):
        return

    @functools.wraps(probe)
    def served_by_policy(num_q_heads: int, top_k: int) -> bool:
        from vllm.models.deepseek_v4_1.nvidia.flashinfer_sparse import (
            current_page_plan,
        )

        return current_page_plan() is not None and num_q_heads <= 128

    setattr(served_by_policy, _WRAPPED, True)
    setattr(flashinfer_utils, name, served_by_policy)


# Bindings into vLLM's registries, applied when the plugin loads.
BINDINGS: tuple[Callable[[], None], ...] = (
    bind_backend_name,
    bind_sm120_config_probe,
)
# Bindings into DeepSeek V4.1's own modules, applied when the module is first
# imported: processes that never build the model never import it.
MODEL_BINDINGS: dict[str, Callable[[], None]] = {
    "vllm.models.deepseek_v41.nvidia.model": bind_attention_selection,
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse": bind_sparse_mla_launcher,
}


def install() -> None:
    """Apply every binding, or arrange it for the module's import; safe to
    call more than once."""
    for bind in BINDINGS:
        bind()
        logger.debug("DeepSeek V4.1 Blackwell fork: %s applied", bind.__name__)
    for module_name, bind in MODEL_BINDINGS.items():
        after_import(module_name, bind)
