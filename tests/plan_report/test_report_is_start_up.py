# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The report's specs, layer class and default --block-size are start-up's:
each held against upstream's own layers, backends and platform logic on a
mocked GPU of the same capability."""

import inspect
import json
from types import SimpleNamespace

import pytest
import torch

from tests.plan_report.start_up import (
    layer_class,
    two_segment_backend,
    vllms_default_block_size,
)
from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.models.deepseek_v41 import attention
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
from vllm_dsv41_plan import report

HF_CONFIG = SimpleNamespace(**json.loads(report.DEFAULT_CONFIG.read_text()))
FAMILIES = [(9, 0), (10, 0), (12, 0), (12, 1)]


def _accepts(function, **kwargs):
    """``kwargs`` that this vLLM's ``function`` takes."""
    names = inspect.signature(function).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def test_the_records_are_the_layers():
    """The record widths the report restates are the ones the layer's
    ``__init__`` writes (it inlines them)."""
    source = inspect.getsource(attention.DeepseekV4Attention.__init__)
    (mx_bytes, mx_align), (v4_bytes, v4_align) = report.MXFP8_RECORD, report.V4_RECORD
    assert f"{mx_bytes} if self.kv_mxfp8 else {v4_bytes}" in source
    assert f"{mx_align} if self.kv_mxfp8 else {v4_align}" in source
    nvfp4 = report.NVFP4_COMPRESSED_RECORD
    assert (
        f'{nvfp4} if self.kv_cache_dtype == "nvfp4_ds_mla"' in source
        or "nvfp4" not in source  # a vLLM without the NVFP4 record
    )


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_the_specs_are_the_layers(set_capability, family):
    capability = set_capability(*family)
    layer_cls = layer_class(capability)
    backend = two_segment_backend(capability.major)
    assert report.layer_class(capability, backend) is layer_cls
    block_size = vllms_default_block_size(capability)
    assert report.default_block_size(layer_cls, capability) == block_size
    mxfp8 = attention._use_v41_mxfp8_kv_record()
    assert (report.packed_record(capability) == report.MXFP8_RECORD) == mxfp8
    record, alignment = report.packed_record(capability)

    ours = report.cache_specs(layer_cls, capability, HF_CONFIG)
    cache_config = CacheConfig(block_size=block_size, cache_dtype="auto")
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.cache_config = cache_config
    cache_dtype, torch_dtype = attention._resolve_dsv4_kv_cache_dtype(
        layer_cls.use_fp8_ds_mla_layout, "auto", cache_config
    )
    theirs = {}
    with set_current_vllm_config(config):
        for layer, ratio in enumerate(HF_CONFIG.compress_ratios):
            prefix = f"model.layers.{layer}.attn"
            swa = DeepseekV4SWACache(
                head_dim=HF_CONFIG.head_dim,
                window_size=HF_CONFIG.sliding_window,
                dtype=torch_dtype,
                prefix=f"{prefix}.swa_cache",
                cache_config=cache_config,
                backend_cls=layer_cls.swa_backend_cls,
                # The page hook where vLLM's SWA backends have one, else
                # the page DeepseekV4Attention builds the cache with.
                block_size=getattr(
                    layer_cls.swa_backend_cls, "get_swa_block_size", lambda: 32
                )(),
                packed_bytes_per_token=record,
                packed_page_alignment=alignment,
                **_accepts(
                    DeepseekV4SWACache.__init__,
                    packed_block_stride_alignment=record if mxfp8 else None,
                ),
            )
            theirs[f"{prefix}.swa_cache"] = swa.get_kv_cache_spec(config)
            if layer in HF_CONFIG.kv_source_layer_ids and ratio > 0:
                # What DeepseekV4Attention.__init__ sets that the spec reads.
                built = SimpleNamespace(
                    is_kv_source=True,
                    compress_ratio=ratio,
                    backend_cls=layer_cls.backend_cls,
                    head_dim=HF_CONFIG.head_dim,
                    kv_cache_dtype=cache_dtype,
                    kv_cache_torch_dtype=torch_dtype,
                    kv_page_alignment=alignment,
                    kv_bytes_per_token=record,
                    compressed_bytes_per_token=record,
                )
                spec = attention.DeepseekV4Attention.get_kv_cache_spec(built, config)
                theirs[prefix] = spec
        for layer in report.owning_indexer_layers(HF_CONFIG):
            cache = attention.DeepseekV4IndexerCache(
                head_dim=attention._indexer_k_cache_head_dim(
                    HF_CONFIG.index_head_dim, False
                ),
                dtype=torch.uint8,
                prefix=f"model.layers.{layer}.attn.indexer.k_cache",
                cache_config=cache_config,
                compress_ratio=HF_CONFIG.compress_ratios[layer],
            )
            theirs[cache.prefix] = cache.get_kv_cache_spec(config)
    assert ours == theirs
