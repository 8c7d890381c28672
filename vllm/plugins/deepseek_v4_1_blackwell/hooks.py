# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The places where upstream vLLM 0.30.0 has no extension point.

Each binding here becomes a small in-place edit in the upstream pull request
(docs/upstream-pr.md lists them). Every binding is idempotent and checks that
the upstream object it replaces still has the shape it was written for, so an
upstream change fails loudly at registration instead of silently unbinding.
"""

import functools
import inspect
from collections.abc import Callable

from vllm.logger import init_logger

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
    replacements = fork_attention_classes()

    @functools.wraps(select)
    def select_with_fork(vllm_config) -> type:
        chosen = select(vllm_config)
        return replacements.get(chosen, chosen)

    setattr(select_with_fork, _WRAPPED, True)
    model._select_dsv4_attn_cls = select_with_fork


BINDINGS: tuple[Callable[[], None], ...] = (
    bind_backend_name,
    bind_attention_selection,
)


def install() -> None:
    """Apply every binding; safe to call more than once."""
    for bind in BINDINGS:
        bind()
        logger.debug("DeepSeek V4.1 Blackwell fork: %s applied", bind.__name__)
