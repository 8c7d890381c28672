# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build DeepSeek V4.1 from a checkpoint folder on a CPU, as vLLM's engine
would on an H200, and load the weights with vLLM's own loader, which fails
when a parameter is left unloaded or a tensor has no parameter.

    python tests/benchmarks/load_engine_checkpoint.py DIR [DIR ...]

Prints one JSON line per folder: the engine config's view of the model, the
number of parameters loaded, the spread of the output head's logits on
unit-size hidden states and each attention layer's sources as the built
model resolved them, or the error the build or the load raised. The
host's GPU is stood in for at the platform boundary (an SM90 CUDA platform;
the compiled op libraries, the flash-attention extension and DeepGEMM are
absent on a CPU, and building the model calls none of them).
"""

import json
import sys
import types

import torch


class _NoOps(types.ModuleType):
    """A compiled module that is absent here: every attribute a no-op."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class _Ops:
    """A ``torch.ops`` namespace of a compiled library that is absent here:
    capability probes answer "no"; other ops exist once the model is being
    built (its constructors look some up) and do nothing."""

    building = False

    def __getattr__(self, name: str):
        probe = "support" in name
        if name.startswith("__") or not (probe or _Ops.building):
            raise AttributeError(name)
        return lambda *args, **kwargs: False


class _NoStream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def _stand_in_for_an_h200() -> None:
    for name in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn"):
        sys.modules[name] = _NoOps(name)
    fa = sys.modules["vllm.vllm_flash_attn"]
    fa.FA2_AVAILABLE = fa.FA3_AVAILABLE = False
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    answers = {
        "get_device_capability": DeviceCapability(9, 0),
        "get_device_name": "NVIDIA H200",
        "get_device_total_memory": 141 << 30,
    }
    for method, value in answers.items():
        setattr(CudaPlatform, method, classmethod(lambda cls, *a, v=value, **k: v))
    CudaPlatform.device_count = classmethod(lambda cls: 1)
    vllm.platforms._current_platform = CudaPlatform()
    torch.cuda.Stream = torch.cuda.Event = _NoStream
    compiled = ("_C", "_moe_C", "_C_cache_ops", "_flashmla_C", "_flashmla_extension_C")
    for namespace in compiled:
        setattr(torch.ops, namespace, _Ops())


def _topology(model: torch.nn.Module) -> list[dict]:
    """Each attention layer's sources, in layer order, as the model built
    them: its compressed-KV and index sources, whether it has a compressor,
    and whose K cache its indexer (if any) scores."""
    layers = []
    for _, attn in model.named_modules():
        if not hasattr(attn, "kv_source_layer_id") or not hasattr(attn, "layer_id"):
            continue
        indexer = attn.indexer
        layers.append(
            {
                "layer": attn.layer_id,
                "ratio": attn.compress_ratio,
                "kv_source": attn.kv_source_layer_id,
                "index_source": attn.index_source_layer_id,
                "compressor": attn.compressor is not None,
                "indexer": None
                if indexer is None
                else ("owns keys" if indexer.owns_k else "reads keys"),
                "index_k_cache": None if indexer is None else indexer.k_cache.prefix,
            }
        )
    return sorted(layers, key=lambda layer: layer["layer"])


def _load(path: str) -> dict:
    """Build the model of the checkpoint at ``path`` and load its weights."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = EngineArgs(
        model=path, limit_mm_per_prompt={"image": 0}, max_model_len=2048
    ).create_engine_config()
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method="tcp://127.0.0.1:29517",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        model_cls, _ = get_model_architecture(config.model_config)
        _Ops.building = True
        with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
            model = model_cls(vllm_config=config, prefix="")
        _Ops.building = False
        DefaultModelLoader(config.load_config).load_weights(model, config.model_config)
    head = model.language_model.lm_head.weight.float()
    hidden = torch.randn(64, head.shape[1], generator=torch.Generator().manual_seed(0))
    hidden = hidden / hidden.pow(2).mean(-1, keepdim=True).sqrt()
    logits = hidden @ head.t()
    # The routers' selection bias as vLLM loaded it, in layer order.
    selection_bias = [
        param.float().tolist()
        for name, param in model.named_parameters()
        if name.endswith("e_score_correction_bias")
    ]
    return {
        "layers": _topology(model),
        "architecture": model_cls.__name__,
        "tokenizer_mode": config.model_config.tokenizer_mode,
        "quantization": config.model_config.quantization,
        "compress_ratios": list(config.model_config.hf_text_config.compress_ratios),
        "parameters": sum(1 for _ in model.parameters()),
        "logit_std": logits.std().item(),
        "top_probability": logits.softmax(-1).max(-1).values.mean().item(),
        "selection_bias": selection_bias,
    }


def main() -> None:
    _stand_in_for_an_h200()
    from vllm.model_executor.layers import sparse_attn_indexer

    # The indexer refuses to be built on CUDA without DeepGEMM, which it only
    # calls in a forward.
    sparse_attn_indexer.has_deep_gemm = lambda: True
    for path in sys.argv[1:]:
        try:
            report = _load(path)
        except Exception as e:  # noqa: BLE001 - each checkpoint's own answer
            report = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps({"checkpoint": path, **report}), flush=True)


if __name__ == "__main__":
    main()
