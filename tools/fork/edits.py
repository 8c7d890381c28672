# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every change the fork makes to files upstream vLLM already has.

One declarative list. Each edit names the upstream file and the class or
function it changes, finds its target by the smallest anchor unique there,
and carries only the fork's own lines, which call into the fork's new modules
(the page policy, the kernel launcher). ``bases`` limits an edit to the
upstream releases it fixes. The build
reads the pristine files from the pinned wheel and applies these
(tools/fork/edit_engine.py); nothing upstream is stored here.

``concern`` puts each edit into one patch of the upstream series
(tools/fork/patch_series.py): ``bugfix`` (a --block-size KV binding cannot
serve fails at start-up), ``pages`` (the page policy, the backend answers
and the caches that use them), ``validation`` (start-up negotiation),
``triton`` (the portable kernel and its routing).
"""

from tools.fork.edit_engine import (
    ADD_TO_CLASS,
    INSERT_AFTER,
    INSERT_BEFORE,
    REPLACE,
    REPLACE_BODY,
    REPLACE_STATEMENT,
    Edit,
)

BUGFIX, PAGES, VALIDATION, TRITON = "bugfix", "pages", "validation", "triton"
CONCERNS = (BUGFIX, PAGES, VALIDATION, TRITON)
# FlashInfer 0.6's fixed SM120 pages, the indexer's DeepGEMM pages and the
# start-up negotiation built on them fix failures of the older base only.
BACKPORT = ("0.30.0",)
DEFAULT = ("0.34.0",)

SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"
SPARSE_MLA = "vllm/models/deepseek_v41/sparse_mla.py"
ATTENTION = "vllm/models/deepseek_v41/attention.py"
FLASHINFER = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"
MODEL = "vllm/models/deepseek_v41/nvidia/model.py"
INDEXER = "vllm/v1/attention/backends/mla/indexer.py"
WORKER_UTILS = "vllm/v1/worker/utils.py"
REGISTRY = "vllm/v1/attention/backends/registry.py"

FI_BACKEND = "DeepseekV4FlashInferMLASparseBackend"
SM120_LAYER = "DeepseekV4FlashInferSM120Attention"
INDEXER_BACKEND = "DeepseekV41IndexerBackend"
INDEXER_CACHE = "DeepseekV4IndexerCache"

# The check every base's selection of the attention class makes, and the
# backends its refusal can point to (TRITON_MLA_SPARSE_DSV41 has its name
# on the default base only).
_GPU_CHECK = '''
def _refuse_without_kernel_for_this_gpu(
    select: Callable[[VllmConfig], type[DeepseekV4Attention]],
) -> Callable[[VllmConfig], type[DeepseekV4Attention]]:
    """Refuse, while the model is built and before any weight loads, an
    attention class whose backend has no kernel for this GPU, whether
    --attention-backend named it or it is the GPU's default."""

    @wraps(select)
    def checked(vllm_config: VllmConfig) -> type[DeepseekV4Attention]:
        attn_cls = select(vllm_config)
        capability = current_platform.get_device_capability()
        backend = attn_cls.backend_cls
        if capability is None or backend.supports_compute_capability(capability):
            return attn_cls
        gpu = f"SM{capability.to_int()}"
        usable = [
            choice.name
            for choice in _DSV41_ATTENTION_BACKENDS
            if choice.get_class().supports_compute_capability(capability)
        ]
        raise ValueError(
            f"{backend.get_name()} has no DeepSeek V4.1 kernel for {gpu} GPUs. "
            + (
                f"Use --attention-backend {' or '.join(usable)}."
                if usable
                else f"No DeepSeek V4.1 attention backend runs on {gpu}."
            )
        )

    return checked
'''


def _gpu_check(*backends: str) -> str:
    """The check, with the backends its refusal can point to."""
    names = "".join(f"    AttentionBackendEnum.{name},\n" for name in backends)
    return (
        f"{_GPU_CHECK}\n\n# The names --attention-backend takes for a DeepSeek V4.1 "
        f"model.\n_DSV41_ATTENTION_BACKENDS = (\n{names})\n"
    )


EDITS: tuple[Edit, ...] = (
    # ---- bugfix: a --block-size KV binding cannot serve fails at start-up
    Edit(
        WORKER_UTILS,
        "",
        INSERT_BEFORE,
        '''
        def splits_into_kernel_blocks(spec: KVCacheSpec) -> bool:
            """Whether packed blocks of ``spec`` may be viewed as kernel blocks."""
            return spec.tokens_per_state > 1


        def kv_cache_binding_error(
            backend: type[AttentionBackend],
            spec: AttentionSpec,
            packed_with: Sequence[tuple[type[AttentionBackend], AttentionSpec]] = (),
        ) -> str | None:
            """Why packed blocks of ``spec`` cannot be bound to the kernel blocks
            ``backend`` reads, or None. A split needs whole kernel pages between
            blocks, whose stride is a multiple of every packed cache's alignment
            (``packed_with``: the caches sharing the blocks)."""
            spec = customize_attention_spec(backend, spec)
            try:
                kernel_block_size = select_common_block_size(spec.block_size, [backend], [spec])
            except ValueError:
                sizes = "- or ".join(
                    str(size.base if isinstance(size, MultipleOf) else size)
                    for size in backend.get_supported_kernel_block_sizes(spec)
                )
                return (
                    f"{spec.block_size}-token blocks are not a multiple of the "
                    f"{sizes}-token kernel blocks {backend.get_name()} reads"
                )
            packed = [spec, *(customize_attention_spec(b, s) for b, s in packed_with)]
            block_stride_alignment = math.lcm(*(s.get_block_stride_alignment() for s in packed))
            kernel_page_bytes = (
                spec.get_num_kernel_states(kernel_block_size) * spec.state_content_size_bytes
            )
            if kernel_block_size == spec.block_size or (
                splits_into_kernel_blocks(spec)
                and block_stride_alignment % kernel_page_bytes == 0
            ):
                return None
            return (
                f"{backend.get_name()} reads {kernel_block_size}-token kernel blocks, "
                f"which packed {spec.block_size}-token blocks cannot be split into"
            )
        ''',
        BUGFIX,
        "one rule says whether a cache's packed blocks bind to a backend",
        anchor="def _block_size_is_supported(",
        bases=DEFAULT,
    ),
    Edit(
        WORKER_UTILS,
        "AttentionGroup.map_kv_cache_to_kernel_blocks",
        REPLACE,
        "not splits_into_kernel_blocks(spec)",
        BUGFIX,
        "binding asks that rule",
        anchor="spec.tokens_per_state <= 1",
        bases=DEFAULT,
    ),
    Edit(
        ATTENTION,
        "",
        INSERT_AFTER,
        """
        from vllm.v1.worker.utils import kv_cache_binding_error
        """,
        BUGFIX,
        "the layers ask binding's rule",
        anchor="from vllm.v1.kv_cache_interface import (",
        bases=DEFAULT,
    ),
    Edit(
        ATTENTION,
        "",
        REPLACE,
        "from vllm.v1.attention.backend import AttentionBackend, AttentionMetadata, "
        "MultipleOf",
        BUGFIX,
        "the check names the sizes kernels read",
        anchor="from vllm.v1.attention.backend import AttentionBackend, AttentionMetadata",
        bases=DEFAULT,
    ),
    Edit(
        ATTENTION,
        "",
        REPLACE,
        "from dataclasses import replace\nfrom functools import cached_property",
        BUGFIX,
        "the check pages the other kv sources' ratios like this layer's",
        anchor="from functools import cached_property",
        bases=DEFAULT,
    ),
    Edit(
        ATTENTION,
        "DeepseekV4Attention.__init__",
        INSERT_BEFORE,
        """
        # A --block-size that KV binding cannot serve fails now, not after the
        # weights load.
        self._check_kv_cache_block_size(vllm_config)
        """,
        BUGFIX,
        "each kv-source layer checks --block-size while it is built",
        anchor="swa_bounded_replay = cache_config.swa_bounded_replay",
        bases=DEFAULT,
    ),
    Edit(
        ATTENTION,
        "DeepseekV4Attention",
        ADD_TO_CLASS,
        '''
        def _check_kv_cache_block_size(self, vllm_config: VllmConfig) -> None:
            """Raise if KV binding cannot serve the caches this kv-source layer
            pages with the user's --block-size."""
            cache_config = vllm_config.cache_config
            if not cache_config.user_specified_block_size or not (
                spec := self.get_kv_cache_spec(vllm_config)
            ):
                return
            caches = [(self.backend_cls, spec)]
            if self.indexer is not None:
                k_cache = self.indexer.k_cache
                spec = k_cache.get_kv_cache_spec(vllm_config)
                caches.append((k_cache.get_attn_backend(), spec))
            # Every kv source's caches share each block: this layer's, paged
            # for each compress ratio the model's kv sources have.
            ratios = {
                int(vllm_config.model_config.hf_config.compress_ratios[layer])
                for layer in self.kv_source_layers
            }
            packed = [
                (b, replace(s, tokens_per_state=r)) for b, s in caches for r in ratios
            ]
            errors = [e for b, s in caches if (e := kv_cache_binding_error(b, s, packed))]
            if not errors:
                return

            def serves(size: int) -> bool:
                resized = [(b, s.copy_with_new_block_size(size)) for b, s in packed]
                return not any(kv_cache_binding_error(b, s, resized) for b, s in resized)

            sizes = {
                size.base if isinstance(size, MultipleOf) else size
                for b, s in packed
                for size in b.get_supported_kernel_block_sizes(s)
            }
            working = [str(size) for size in sorted(sizes) if serves(size)]
            raise ValueError(
                f"--block-size {cache_config.block_size} cannot serve DeepSeek V4.1: "
                f"{errors[0]}. "
                + (
                    f"Use --block-size {' or '.join(working)}, or leave it unset."
                    if working
                    else "Choose another --attention-backend."
                )
            )
        ''',
        BUGFIX,
        "the check: binding's rule for the layer's caches, and what serves",
        bases=DEFAULT,
    ),
    # ---- pages: the hooks, the policy's answers, the caches built from them
    Edit(
        SWA,
        "DeepseekSparseSWABackend",
        ADD_TO_CLASS,
        '''
        @classmethod
        def get_swa_block_size(cls) -> int:
            """Tokens per sliding-window page. Any multiple of 32 works for
            kernels that take the page size at run time; a backend whose
            kernels are built for one page size answers that size."""
            return 32
        ''',
        PAGES,
        "the SWA backend says which page the sliding-window cache gets",
        bases=BACKPORT,
    ),
    Edit(
        SPARSE_MLA,
        "DeepseekV4SparseMLABackend",
        ADD_TO_CLASS,
        '''
        @classmethod
        def get_compressed_block_size(cls, compress_ratio: int) -> int | None:
            """Tokens per compressed-KV page for a layer of ``compress_ratio``;
            None pages the cache with ``--block-size``."""
            return None
        ''',
        PAGES,
        "the sparse-MLA backend may fix the compressed-KV page",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        "",
        REPLACE,
        """
        from vllm.v1.attention.backends.mla.sparse_swa import (
            DeepseekSparseSWABackend,
            DeepseekV4SWACache,
        )
        """,
        PAGES,
        "import the SWA backend whose page the cache asks for",
        anchor="from vllm.v1.attention.backends.mla.sparse_swa import "
        "DeepseekV4SWACache",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        "DeepseekV4Attention.__init__",
        REPLACE,
        """
        block_size=(
            self.swa_backend_cls or DeepseekSparseSWABackend
        ).get_swa_block_size(),
        """,
        PAGES,
        "the sliding-window cache is built with its backend's page",
        anchor="block_size=32,",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        "DeepseekV4Attention.get_kv_cache_spec",
        REPLACE,
        """
        block_size=(
            self.backend_cls.get_compressed_block_size(self.compress_ratio)
            or vllm_config.cache_config.block_size
        ),
        """,
        PAGES,
        "the compressed-KV spec takes the backend's page when it fixes one",
        anchor="block_size=vllm_config.cache_config.block_size,",
        bases=BACKPORT,
    ),
    Edit(
        INDEXER,
        "",
        INSERT_AFTER,
        """
        from vllm.v1.attention.backends.mla import indexer_pages
        """,
        PAGES,
        "the indexer backend answers from DeepGEMM's page rule",
        anchor="from vllm.v1.attention.backend import",
        bases=BACKPORT,
    ),
    Edit(
        INDEXER,
        f"{INDEXER_BACKEND}.get_supported_kernel_block_sizes",
        INSERT_BEFORE,
        """
        # DeepGEMM's paged MQA logits read pages of a fixed number of
        # compressed states: one kernel page per compress ratio.
        return indexer_pages.kernel_block_sizes()
        """,
        PAGES,
        "the indexer's kernel pages hold the states DeepGEMM reads, per ratio",
        # Before upstream's own answers, so none of them runs first.
        anchor="return [64 if current_platform.is_device_capability_family(90)",
        bases=BACKPORT,
    ),
    Edit(
        INDEXER,
        INDEXER_BACKEND,
        ADD_TO_CLASS,
        '''
        @classmethod
        def get_indexer_block_size(cls, compress_ratio: int) -> int:
            """Tokens per K-cache page of an indexer over states of
            ``compress_ratio`` tokens each."""
            return indexer_pages.block_size(compress_ratio)

        @classmethod
        def check_indexer_pages(cls) -> None:
            """Raise at start-up if the installed DeepGEMM cannot read these
            pages on this GPU, rather than at the first decode."""
            capability = current_platform.get_device_capability()
            if capability is not None:
                indexer_pages.confirm_indexer_pages(capability)
        ''',
        PAGES,
        "the indexer backend pages its K caches and confirms them with DeepGEMM",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        f"{INDEXER_CACHE}.get_kv_cache_spec",
        REPLACE,
        """
        block_size=(
            DeepseekV41IndexerBackend.get_indexer_block_size(self.compress_ratio)
            or self.cache_config.block_size
        ),
        """,
        PAGES,
        "the indexer K cache is paged as its kernels read it",
        anchor="block_size=self.cache_config.block_size,",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        f"{INDEXER_CACHE}.__init__",
        INSERT_AFTER,
        """
        DeepseekV41IndexerBackend.check_indexer_pages()
        """,
        PAGES,
        "an indexer page DeepGEMM refuses fails while the model is built",
        anchor="self.compress_ratio = compress_ratio",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        "",
        INSERT_AFTER,
        """
        from vllm.models.deepseek_v41.nvidia import sparse_mla_pages
        """,
        PAGES,
        "the backends answer from the page policy",
        anchor="from vllm.models.deepseek_v41.common.ops import",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        f"{FI_BACKEND}.get_supported_kernel_block_sizes",
        INSERT_BEFORE,
        """
        # Kernels built for fixed pages (some FlashInfer SM120 builds) take
        # the policy's compressed-KV pages, not only the default one.
        plan = sparse_mla_pages.current_plan()
        if plan is not None and (sizes := plan.kernel_block_sizes()):
            return sizes
        """,
        PAGES,
        "kernel page sizes come from the page policy",
        anchor="return [128]",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        FI_BACKEND,
        ADD_TO_CLASS,
        """
        @classmethod
        def get_preferred_block_size(cls, default_block_size: int) -> int:
            # The default where a compressed-KV kernel takes it, else the
            # largest page one does.
            sizes = [
                s.base if isinstance(s, MultipleOf) else s
                for s in cls.get_supported_kernel_block_sizes()
            ]
            return default_block_size if default_block_size in sizes else max(sizes)

        @classmethod
        def get_compressed_block_size(cls, compress_ratio: int) -> int | None:
            plan = sparse_mla_pages.current_plan()
            return plan.compressed_block_size(compress_ratio) if plan else None
        """,
        PAGES,
        "preferred --block-size and compressed-KV pages from the policy",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        "",
        INSERT_AFTER,
        '''
        class DeepseekSparseSWAFlashInferSM120Backend(DeepseekSparseSWAFlashInferBackend):
            """Sliding-window cache of the two-segment layer, paged as the page
            policy says (64 tokens for FlashInfer's fixed-page SM120 kernels)."""

            @staticmethod
            def _fixed_page() -> int | None:
                plan = sparse_mla_pages.current_plan()
                return plan.fixed_page if plan else None

            @classmethod
            def get_swa_block_size(cls) -> int:
                return cls._fixed_page() or super().get_swa_block_size()

            @staticmethod
            def get_supported_kernel_block_sizes(
                kv_cache_spec=None,
            ) -> list[int | MultipleOf]:
                # kv_cache_spec may be passed; the page does not depend on it.
                if page := DeepseekSparseSWAFlashInferSM120Backend._fixed_page():
                    return [page]
                return DeepseekSparseSWAFlashInferBackend.get_supported_kernel_block_sizes()

            @classmethod
            def get_preferred_block_size(cls, default_block_size: int) -> int:
                if page := cls._fixed_page():
                    return page
                return super().get_preferred_block_size(default_block_size)
        ''',
        PAGES,
        "an SWA backend for the two-segment layer with the policy's page",
        anchor="class DeepseekSparseSWAFlashInferBackend(",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        SM120_LAYER,
        REPLACE,
        "swa_backend_cls = DeepseekSparseSWAFlashInferSM120Backend",
        PAGES,
        "the two-segment layer pages its SWA cache as the policy says",
        anchor="swa_backend_cls = DeepseekSparseSWAFlashInferBackend",
        bases=BACKPORT,
    ),
    # ---- validation: negotiate before any cache is built
    Edit(
        SPARSE_MLA,
        "",
        INSERT_BEFORE,
        """
        from vllm.models.deepseek_v41.nvidia.sparse_mla_pages import SparseMLAPlan
        """,
        VALIDATION,
        "the plan a backend's negotiation returns",
        anchor="from vllm.platforms import current_platform",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        "",
        INSERT_BEFORE,
        """
        from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
        """,
        VALIDATION,
        "--block-size is checked against the indexer's kernel pages too",
        anchor="from vllm.v1.attention.backends.mla.sparse_swa import "
        "DeepseekSparseSWABackend",
        bases=BACKPORT,
    ),
    Edit(
        SPARSE_MLA,
        "DeepseekV4SparseMLABackend",
        ADD_TO_CLASS,
        '''
        @classmethod
        def negotiate(cls, vllm_config: VllmConfig) -> "SparseMLAPlan | None":
            """Check a layer about to be built against what this backend's
            kernels serve, before any cache exists; raise the fix for an
            unserved configuration. Return the plan the layer runs, if any."""
            return None
        ''',
        VALIDATION,
        "a backend can refuse a configuration while the layers are built",
        bases=BACKPORT,
    ),
    Edit(
        SPARSE_MLA,
        "DeepseekV4FlashMLABackend",
        ADD_TO_CLASS,
        """
        @classmethod
        def negotiate(cls, vllm_config: VllmConfig) -> "SparseMLAPlan | None":
            from vllm.models.deepseek_v41.nvidia import sparse_mla_pages as pages
            from vllm.v1.attention.backends.mla.indexer import (
                DeepseekV41IndexerBackend,
            )

            # A --block-size its packed caches cannot be bound with fails
            # here, before the weights load, rather than at KV binding.
            capability = current_platform.get_device_capability()
            cache_config = vllm_config.cache_config
            if capability is not None and cache_config.user_specified_block_size:
                pages.check_block_size(
                    cache_config.block_size,
                    pages.SparseMLAPlan(capability, pages.SparseMLAKernel.FLASHMLA),
                    pages.PagedBackends(cls, DeepseekV41IndexerBackend),
                )
            return None
        """,
        VALIDATION,
        "FlashMLA refuses a --block-size its packed caches cannot bind with",
        bases=BACKPORT,
    ),
    Edit(
        ATTENTION,
        "DeepseekV4Attention.__init__",
        INSERT_AFTER,
        """
        # Before any cache or kernel is set up: an unserved configuration
        # fails here with one message saying how to fix it.
        self.sparse_mla_plan = self.backend_cls.negotiate(vllm_config)
        """,
        VALIDATION,
        "every DeepSeek V4.1 layer negotiates with its backend first",
        anchor="super().__init__()",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        FI_BACKEND,
        ADD_TO_CLASS,
        """
        @classmethod
        def paged_backends(cls) -> sparse_mla_pages.PagedBackends:
            return sparse_mla_pages.PagedBackends(
                cls,
                DeepseekV41IndexerBackend,
                DeepseekV4FlashInferSM120Attention.get_padded_num_q_heads,
            )

        @classmethod
        def negotiate(cls, vllm_config: VllmConfig) -> sparse_mla_pages.SparseMLAPlan:
            return sparse_mla_pages.negotiate_layer(vllm_config, cls.paged_backends())
        """,
        VALIDATION,
        "the FlashInfer backend negotiates through the page policy",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        f"{FI_BACKEND}.supports_combination",
        REPLACE_BODY,
        """
        # The same check start-up makes, so the two cannot disagree.
        return sparse_mla_pages.unsupported_reason(
            device_capability, kv_cache_dtype, block_size, cls.paged_backends()
        )
        """,
        VALIDATION,
        "supports_combination asks the same validation as start-up",
        bases=BACKPORT,
    ),
    # ---- triton: the portable kernel, chosen by its own name (the older
    # base: also where its FlashInfer has no kernel for the GPU or shape)
    Edit(
        REGISTRY,
        "AttentionBackendEnum",
        INSERT_AFTER,
        """
        TRITON_MLA_SPARSE_DSV41 = (
            "vllm.models.deepseek_v41.nvidia.triton_sparse.DeepseekV4TritonMLASparseBackend"
        )
        """,
        TRITON,
        "the Triton kernel's DeepSeek V4.1 backend has a name of its own",
        anchor="FLASHINFER_MLA_SPARSE_DSV41 = (",
        bases=DEFAULT,
    ),
    Edit(
        MODEL,
        "",
        INSERT_AFTER,
        "from vllm.models.deepseek_v41.nvidia.triton_sparse import "
        "DeepseekV4TritonMLAAttention",
        TRITON,
        "the model builds the Triton layer",
        anchor="from vllm.models.deepseek_v41.nvidia.flashmla import",
        bases=DEFAULT,
    ),
    Edit(
        MODEL,
        "",
        REPLACE,
        "from functools import partial, wraps",
        TRITON,
        "the selection's GPU check keeps the selector's name",
        anchor="from functools import partial",
        bases=DEFAULT,
    ),
    Edit(
        MODEL,
        "",
        INSERT_AFTER,
        "from functools import wraps",
        TRITON,
        "the selection's GPU check keeps the selector's name",
        anchor="from collections.abc import Callable, Iterable",
        bases=BACKPORT,
    ),
    *(
        Edit(
            MODEL,
            "",
            INSERT_BEFORE,
            _gpu_check(*backends),
            TRITON,
            "every attention class the model selects is refused off its GPUs",
            anchor="def _select_dsv4_attn_cls(",
            bases=bases,
        )
        for bases, backends in (
            (
                DEFAULT,
                (
                    "FLASHMLA_SPARSE_DSV41",
                    "FLASHMLA_MEGA_ATTN_DSV41",
                    "FLASHINFER_MLA_SPARSE_DSV41",
                    "TRITON_MLA_SPARSE_DSV41",
                ),
            ),
            (BACKPORT, ("FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41")),
        )
    ),
    Edit(
        MODEL,
        "",
        REPLACE,
        "@_refuse_without_kernel_for_this_gpu\ndef _select_dsv4_attn_cls(",
        TRITON,
        "the selection asks that check",
        anchor="def _select_dsv4_attn_cls(",
    ),
    Edit(
        MODEL,
        "_select_dsv4_attn_cls",
        INSERT_BEFORE,
        """
        if backend is AttentionBackendEnum.TRITON_MLA_SPARSE_DSV41:
            return DeepseekV4TritonMLAAttention
        """,
        TRITON,
        "TRITON_MLA_SPARSE_DSV41 builds the two-segment layer on the Triton kernel",
        anchor="if backend is AttentionBackendEnum.FLASHMLA_MEGA_ATTN_DSV41:",
        bases=DEFAULT,
    ),
    Edit(
        FLASHINFER,
        "",
        INSERT_AFTER,
        """
        from vllm.models.deepseek_v41.nvidia import sparse_mla_kernel, sparse_mla_launcher
        """,
        TRITON,
        "the two-segment layer runs its kernel through the launcher",
        anchor="from vllm.models.deepseek_v41.common.ops import",
        bases=DEFAULT,
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}.__init__",
        REPLACE_STATEMENT,
        "",
        TRITON,
        "the layer's kernel choice asks FlashInfer for its shapes",
        anchor="import has_flashinfer_sparse_mla_sm120_config",
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}.__init__",
        REPLACE_STATEMENT,
        """
        self.sparse_mla_kernel = self.choose_sparse_mla_kernel(
            self.padded_heads, required_topk
        )
        """,
        TRITON,
        "each two-segment layer class chooses its kernel while it is built",
        anchor="if not has_flashinfer_sparse_mla_sm120_config(",
        bases=DEFAULT,
    ),
    Edit(
        FLASHINFER,
        SM120_LAYER,
        ADD_TO_CLASS,
        '''
        @classmethod
        def choose_sparse_mla_kernel(
            cls, num_q_heads: int, top_k: int
        ) -> sparse_mla_kernel.SparseMLAKernel:
            """FlashInfer's SM120 decode kernel for this shape; refused while the
            model is built where the installed FlashInfer has none."""
            from vllm.utils.flashinfer import has_flashinfer_sparse_mla_sm120_config

            if not has_flashinfer_sparse_mla_sm120_config(num_q_heads, top_k):
                raise RuntimeError(
                    "FLASHINFER_MLA_SPARSE_DSV41 needs a FlashInfer SM120 sparse-MLA "
                    f"decode kernel for {num_q_heads} heads at top-k {top_k}, which "
                    "the installed FlashInfer lacks. Install a FlashInfer that has "
                    "it (flashinfer-ai/flashinfer#4380), or use --attention-backend "
                    "TRITON_MLA_SPARSE_DSV41."
                )
            return sparse_mla_kernel.SparseMLAKernel.FLASHINFER_SM120
        ''',
        TRITON,
        "a shape FlashInfer lacks is refused naming the Triton backend",
        bases=DEFAULT,
    ),
    # The older base: FlashInfer 0.6's SM120 kernels lack some shapes, so its
    # page policy runs the Triton kernel where they do, and on SM90.
    Edit(
        FLASHINFER,
        f"{FI_BACKEND}.supports_compute_capability",
        REPLACE,
        "capability.to_int() >= sparse_mla_kernel.TRITON_MIN_CAPABILITY",
        TRITON,
        "the backend runs from SM90 on, through the Triton kernel off Blackwell",
        anchor="capability.major in [10, 12]",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        "",
        REPLACE,
        """
        import (
            sparse_mla_kernel,
            sparse_mla_launcher,
            sparse_mla_pages,
        )
        """,
        TRITON,
        "the two-segment layer runs its kernel through the launcher",
        anchor="import sparse_mla_pages",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}.__init__",
        REPLACE,
        "self.sparse_mla_plan.serves(",
        TRITON,
        "a shape FlashInfer lacks is served by the Triton kernel the policy chose",
        anchor="has_flashinfer_sparse_mla_sm120_config(",
        bases=BACKPORT,
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}.__init__",
        INSERT_AFTER,
        "self.sparse_mla_kernel = self.sparse_mla_plan.kernel",
        TRITON,
        "the layer runs the kernel the page policy chose",
        anchor="if not self.sparse_mla_plan.serves(",
        bases=BACKPORT,
    ),
    Edit(
        MODEL,
        "_select_dsv4_attn_cls",
        REPLACE,
        """
        device_capability.major != 10:
            # Off SM10x the two-segment layer runs, on FlashInfer's SM120
            # kernels or the portable Triton kernel (SM90).
            return DeepseekV4FlashInferSM120Attention
        return DeepseekV4FlashInferMLAAttention
        """,
        TRITON,
        "FLASHINFER_MLA_SPARSE_DSV41 off Blackwell runs the two-segment layer",
        # The FlashInfer branch's test; the default branch has one like it.
        anchor="device_capability.major == 12:\n"
        "            return DeepseekV4FlashInferSM120Attention\n"
        "        return DeepseekV4FlashInferMLAAttention",
        bases=BACKPORT,
    ),
    # Every base: the layer runs the kernel chosen for it.
    Edit(
        FLASHINFER,
        SM120_LAYER,
        ADD_TO_CLASS,
        '''
        def _sparse_mla_decode(self, **kwargs) -> torch.Tensor:
            """Run the kernel chosen for this layer when it was built."""
            return sparse_mla_launcher.launch(self.sparse_mla_kernel, **kwargs)
        ''',
        TRITON,
        "each layer runs the kernel chosen for it",
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}._forward_decode",
        REPLACE,
        "self._sparse_mla_decode(",
        TRITON,
        "decode goes through the layer's kernel",
        anchor="flashinfer_trtllm_batch_decode_sparse_mla_dsv4(",
    ),
    Edit(
        FLASHINFER,
        f"{SM120_LAYER}._forward_prefill",
        REPLACE,
        "self._sparse_mla_decode(",
        TRITON,
        "prefill goes through the layer's kernel",
        anchor="flashinfer_trtllm_batch_decode_sparse_mla_dsv4(",
    ),
)


def markdown_table() -> str:
    """The edit list as the table docs/upstream-pr.md carries."""
    rows = [
        "| patch | upstream file | function or class | what the edit does |",
        "| --- | --- | --- | --- |",
    ]
    for edit in EDITS:
        scope = f"`{edit.scope}`" if edit.scope else "module"
        rows.append(
            f"| {CONCERNS.index(edit.concern) + 1} | `{edit.file}` | {scope} "
            f"| {edit.why} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
