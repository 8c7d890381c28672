# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Each binding into upstream vLLM: effect, idempotence, and a loud failure
when upstream changes the shape it was written for."""

from types import SimpleNamespace

import pytest

from vllm.models.deepseek_v4_1.nvidia import flashinfer_sparse as fork
from vllm.models.deepseek_v41.nvidia import model
from vllm.plugins.deepseek_v4_1_blackwell import hooks
from vllm.v1.attention.backends.registry import AttentionBackendEnum as Backend

DeepseekV4FlashMLAAttention = model.DeepseekV4FlashMLAAttention


@pytest.fixture
def installed(monkeypatch):
    """Bindings applied, with upstream's originals restored afterwards."""
    from vllm.v1.attention.backends import registry

    monkeypatch.setattr(model, "_select_dsv4_attn_cls", model._select_dsv4_attn_cls)
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
