# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""K-cache pages of DeepSeek V4.1's sparse indexer.

DeepGEMM's paged MQA logits read the indexer's K cache in pages of a fixed
number of compressed states, and each release takes its own counts on each
GPU. Every release vLLM ships takes 64 on every GPU it serves, so a layer of
compress ratio r gets pages of 64 * r tokens; start-up asks DeepGEMM itself.
"""

import functools

from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability

# Compressed DeepSeek V4.1 layers; ratio 0 is a sliding-window-only layer.
DSV41_COMPRESS_RATIOS = (1, 2)
INDEXER_STATES = 64


def block_size(compress_ratio: int) -> int:
    """Tokens per indexer K-cache page of a layer of ``compress_ratio``."""
    return INDEXER_STATES * max(compress_ratio, 1)


def kernel_block_sizes(states: int = INDEXER_STATES) -> list[int]:
    """Token pages of ``states`` states, one per compress ratio, largest first."""
    return sorted({states * r for r in DSV41_COMPRESS_RATIOS}, reverse=True)


def deepgemm_takes(states_per_page: int) -> bool:
    """Whether DeepGEMM's paged-MQA planner takes pages of ``states_per_page``
    on this GPU, asked with a one-request metadata call."""
    import torch

    from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

    lens = torch.ones((1, 1), dtype=torch.int32, device="cuda")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        get_paged_mqa_logits_metadata(lens, states_per_page, num_sms)
    except RuntimeError:  # DeepGEMM's host assertion
        return False
    return True


@functools.cache
def confirm_indexer_pages(capability: DeviceCapability) -> None:
    """Raise at start-up, naming what it takes, if DeepGEMM refuses the
    indexer pages on this GPU; nothing to ask off CUDA or without DeepGEMM."""
    from vllm.utils.import_utils import has_deep_gemm

    if not (current_platform.is_cuda() and has_deep_gemm()):
        return
    if deepgemm_takes(INDEXER_STATES):
        return
    taken = [n for n in (32, 64, 128) if deepgemm_takes(n)]
    raise ValueError(
        f"DeepGEMM does not take DeepSeek V4.1's indexer K-cache pages of "
        f"{INDEXER_STATES} states on this SM{capability.to_int()} GPU (it takes "
        f"{taken or 'none of [32, 64, 128]'}). Install the DeepGEMM this vLLM "
        "ships (remove a standalone deep_gemm)."
    )
