# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""DeepSeek V4.1 on Blackwell: FlashInfer sparse MLA with negotiated pages."""
