# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Each binding into upstream vLLM: effect, idempotence, and a loud failure
when upstream changes the shape it was written for."""

from types import SimpleNamespace

import pytest

from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as fork
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as upstream
from vllm.models.deepseek_v41.nvidia import model
from vllm.plugins.deepseek_v4_1_blackwell import hooks
from vllm.v1.attention.backends.registry import AttentionBackendEnum as Backend

DeepseekV4FlashMLAAttention = model.DeepseekV4FlashMLAAttention
LAUNCHER = "flashinfer_trtllm_batch_decode_sparse_mla_dsv4"
PROBE = "has_flashinfer_sparse_mla_sm120_config"


@pytest.fixture
def installed(monkeypatch):
    """Bindings applied, with upstream's originals restored afterwards."""
    from vllm.utils import flashinfer as flashinfer_utils
    from vllm.v1.attention.backends import registry

    monkeypatch.setattr(model, "_select_dsv4_attn_cls", model._select_dsv4_attn_cls)
    monkeypatch.setattr(upstream, LAUNCHER, getattr(upstream, LAUNCHER))
    monkeypatch.setattr(flashinfer_utils, PROBE, getattr(flashinfer_utils, PROBE))
    monkeypatch.setattr(registry, "_ATTN_OVERRIDES", dict(registry._ATTN_OVERRIDES))
    hooks.install()


def _config(backend):
    return SimpleNamespace(attention_config=SimpleNamespace(backend=backend))


@pytest.mark.parametrize(
    "capability, backend, expected",
    [
        ((12, 0), None, fork.DeepseekV4FlashInferSM120Attention),
        ((12, 1), None, fork.DeepseekV4FlashInferSM120Attention),
        (
            (12, 0),
            Backend.FLASHINFER_MLA_SPARSE_DSV41,
            fork.DeepseekV4FlashInferSM120Attention,
        ),
        (
            (12, 1),
            Backend.FLASHINFER_MLA_SPARSE_DSV4,
            fork.DeepseekV4FlashInferSM120Attention,
        ),
        (
            (10, 0),
            Backend.FLASHINFER_MLA_SPARSE_DSV41,
            fork.DeepseekV4FlashInferMLAAttention,
        ),
        (
            (10, 3),
            Backend.FLASHINFER_MLA_SPARSE_DSV4,
            fork.DeepseekV4FlashInferMLAAttention,
        ),
        # Off Blackwell the two-segment class runs on the Triton kernel.
        (
            (9, 0),
            Backend.FLASHINFER_MLA_SPARSE_DSV41,
            fork.DeepseekV4FlashInferSM120Attention,
        ),
        # Choices that are not this backend stay upstream's.
        ((10, 0), None, DeepseekV4FlashMLAAttention),
        ((9, 0), None, DeepseekV4FlashMLAAttention),
        ((12, 0), Backend.FLASHMLA_SPARSE_DSV41, DeepseekV4FlashMLAAttention),
    ],
)
def test_model_builds_the_fork_attention_class(
    installed, set_capability, capability, backend, expected
):
    set_capability(*capability)
    assert model._select_dsv4_attn_cls(_config(backend)) is expected


def test_backend_name_resolves_to_the_fork(installed):
    assert Backend.FLASHINFER_MLA_SPARSE_DSV41.get_class() is (
        fork.DeepseekV4FlashInferMLASparseBackend
    )
    # The V4.0 model's backend of the same family is left alone.
    assert Backend.FLASHINFER_MLA_SPARSE_DSV4.get_class().__module__.startswith(
        "vllm.models.deepseek_v4."
    )


def test_install_is_idempotent(installed, set_capability):
    wrapped = model._select_dsv4_attn_cls
    hooks.install()
    hooks.install()
    assert model._select_dsv4_attn_cls is wrapped
    set_capability(12, 0)
    assert model._select_dsv4_attn_cls(_config(None)) is (
        fork.DeepseekV4FlashInferSM120Attention
    )


def test_selection_binding_refuses_a_changed_upstream(monkeypatch):
    def reshaped(vllm_config, device):  # upstream grew an argument
        return None

    monkeypatch.setattr(model, "_select_dsv4_attn_cls", reshaped)
    with pytest.raises(hooks.UpstreamShapeChanged, match="_select_dsv4_attn_cls"):
        hooks.bind_attention_selection()
    monkeypatch.delattr(model, "_select_dsv4_attn_cls")
    with pytest.raises(hooks.UpstreamShapeChanged):
        hooks.bind_attention_selection()


def test_backend_binding_refuses_a_changed_upstream(monkeypatch):
    from vllm.v1.attention.backends import registry

    monkeypatch.setattr(
        registry, "AttentionBackendEnum", SimpleNamespace(), raising=True
    )
    with pytest.raises(hooks.UpstreamShapeChanged, match="FLASHINFER_MLA_SPARSE_DSV41"):
        hooks.bind_backend_name()


def test_upstream_classes_the_bindings_map_still_exist():
    mapping = hooks.fork_attention_classes()
    assert set(mapping.values()) == {
        fork.DeepseekV4FlashInferSM120Attention,
        fork.DeepseekV4FlashInferMLAAttention,
    }
    for upstream_cls, fork_cls in mapping.items():
        assert issubclass(fork_cls, upstream_cls)


def test_launcher_runs_the_kernel_the_policy_chose(installed, monkeypatch):
    from vllm.models.deepseek_v4_1.nvidia import sparse_mla_launcher
    from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy
    from vllm.v1.attention.ops import triton_dsv41_sparse_mla

    launch = getattr(upstream, LAUNCHER)
    calls = []
    monkeypatch.setattr(
        triton_dsv41_sparse_mla,
        "triton_sparse_mla_dsv41",
        lambda *args, **kwargs: calls.append(("triton", args, kwargs)),
    )
    monkeypatch.setattr(sparse_mla_launcher, "_kernel_path", policy.TRITON)
    launch(
        query="q",
        swa_kv_cache="swa",
        workspace_buffer="ws",
        sparse_indices="idx",
        compressed_kv_cache="cmp",
        out="out",
        bmm1_scale=0.5,
        sinks="sinks",
        kv_layout="NHD",
        swa_topk_lens="lens",
        extra_sparse_indices="xidx",
        extra_sparse_topk_lens="xlens",
    )
    (kind, args, kwargs) = calls[0]
    assert args == ("q", "swa", "idx", "lens", "out", 0.5)
    assert kwargs == dict(
        sinks="sinks",
        compressed_kv_cache="cmp",
        extra_sparse_indices="xidx",
        extra_sparse_topk_lens="xlens",
        kv_layout="NHD",
    )


def test_launcher_runs_flashinfer_otherwise(monkeypatch):
    from vllm.models.deepseek_v4_1.nvidia import sparse_mla_launcher
    from vllm.v1.attention.backends.mla import sparse_mla_page_policy as policy

    seen = []
    launch = sparse_mla_launcher.make_launcher(lambda **kw: seen.append(kw))
    for path in (policy.FLASHINFER_SM120, policy.TRTLLM_GEN):
        monkeypatch.setattr(sparse_mla_launcher, "_kernel_path", path)
        launch(query="q", seq_lens="s")
    assert seen == [dict(query="q", seq_lens="s")] * 2


def test_sm120_probe_answers_from_the_policy(installed, set_capability):
    from vllm.utils import flashinfer as flashinfer_utils

    probe = getattr(flashinfer_utils, PROBE)
    set_capability(12, 0)
    # (64, 384) is not in FlashInfer 0.6.18's table; the Triton kernel runs it.
    assert probe(64, 384) is True
    assert probe(256, 128) is False
    set_capability(8, 0)
    assert probe(64, 128) is False


def test_launcher_and_probe_bindings_are_idempotent(installed):
    from vllm.utils import flashinfer as flashinfer_utils

    before = getattr(upstream, LAUNCHER), getattr(flashinfer_utils, PROBE)
    hooks.install()
    assert (getattr(upstream, LAUNCHER), getattr(flashinfer_utils, PROBE)) == before
