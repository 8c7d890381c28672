# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""K-cache pages of DeepSeek V4.1's sparse indexer.

DeepGEMM's paged MQA logits read the indexer's K cache in pages of a fixed
number of compressed states, and each release takes its own counts on each
GPU. The indexer backend pages its caches and names its kernel pages from
here, and the indexer cache confirms the pages with DeepGEMM when it is built.
"""

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability

# Compressed DeepSeek V4.1 layers; ratio 0 is a sliding-window-only layer.
DSV41_COMPRESS_RATIOS = (1, 2)

# States per indexer K-cache page that DeepGEMM's paged MQA logits take with
# FP8 keys, by release and GPU major (its host check; tests hold this table
# against the shipped library). Other releases are planned at INDEXER_STATES
# and confirmed by DeepGEMM itself at start-up.
DEEPGEMM_INDEXER_STATES: dict[str, dict[int, frozenset[int]]] = {
    "2.6.1": {9: frozenset({64})},
    "2.8.0": {
        9: frozenset({32, 64}),
        10: frozenset({32, 64, 128}),
        12: frozenset({64}),
    },
    "2.8.1": {
        9: frozenset({32, 64}),
        10: frozenset({32, 64, 128}),
        12: frozenset({32, 64}),
    },
}
# Taken by every release above on every GPU it serves.
INDEXER_STATES = 64
# What start-up asks DeepGEMM about when it refuses the planned pages.
INDEXER_STATE_CANDIDATES = (32, 64, 128)


def _installed_deepgemm() -> tuple[str, str] | None:
    """Version and kind of the DeepGEMM vLLM uses: a standalone ``deep_gemm``
    before the vendored copy, as ``has_deep_gemm`` prefers. Read from source,
    since importing it loads a compiled part built for the GPU host's torch."""
    for module, kind in (
        ("deep_gemm", "standalone"),
        ("vllm.third_party.deep_gemm", "vendored"),
    ):
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            continue
        version = "unknown"
        for node in ast.parse(Path(spec.origin).read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "__version__"
                and isinstance(node.value, ast.Constant)
            ):
                version = str(node.value.value)
        return version, kind
    return None


@dataclass(frozen=True)
class IndexerPages:
    """Indexer K-cache pages of ``states_per_page`` compressed states, so a
    layer of compress ratio r pages r times as many tokens, like the
    compressed KV it indexes. ``accepted`` is what the trusted ``deepgemm``
    takes here (None: unknown until it is asked)."""

    states_per_page: int
    accepted: frozenset[int] | None
    deepgemm: str

    def block_size(self, compress_ratio: int) -> int:
        """Tokens per indexer K-cache page of a layer of ``compress_ratio``."""
        return self.states_per_page * max(compress_ratio, 1)

    def kernel_block_sizes(self) -> list[int]:
        """The indexer kernels' token pages, one per ratio, largest first."""
        return sorted({self.block_size(r) for r in DSV41_COMPRESS_RATIOS}, reverse=True)


@functools.cache
def indexer_pages(capability: DeviceCapability) -> IndexerPages:
    """The indexer K-cache pages for ``capability`` and the installed DeepGEMM."""
    installed = _installed_deepgemm()
    if installed is None:
        return IndexerPages(INDEXER_STATES, None, "no DeepGEMM installed")
    version, kind = installed
    accepted = DEEPGEMM_INDEXER_STATES.get(version, {}).get(capability.major)
    states = INDEXER_STATES
    if accepted is not None and INDEXER_STATES not in accepted:
        states = max(accepted)
    return IndexerPages(states, accepted, f"DeepGEMM {version} ({kind})")


def current_indexer_pages() -> IndexerPages | None:
    """The indexer K-cache pages for this process's GPU (None: no GPU)."""
    capability = current_platform.get_device_capability()
    return None if capability is None else indexer_pages(capability)


def _deepgemm_takes(states_per_page: int) -> bool:
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
def confirm_indexer_pages(capability: DeviceCapability) -> IndexerPages:
    """``indexer_pages(capability)`` confirmed by DeepGEMM on this GPU, or an
    error naming the pages it takes; returned unasked off CUDA or without
    DeepGEMM."""
    from vllm.utils.import_utils import has_deep_gemm

    pages = indexer_pages(capability)
    if not (current_platform.is_cuda() and has_deep_gemm()):
        return pages
    if _deepgemm_takes(pages.states_per_page):
        return pages
    taken = [n for n in INDEXER_STATE_CANDIDATES if _deepgemm_takes(n)]
    raise ValueError(
        f"{pages.deepgemm} does not take DeepSeek V4.1's indexer K-cache pages "
        f"of {pages.states_per_page} states on this SM{capability.to_int()} GPU "
        f"(it takes {taken or 'none of ' + str(list(INDEXER_STATE_CANDIDATES))}). "
        "Install the DeepGEMM this vLLM ships (remove a standalone deep_gemm) "
        "or one whose paged MQA logits take 64-state pages."
    )
