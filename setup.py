# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Build hook for the development distribution described in pyproject.toml.

It ships no Python packages: the overlay's files belong to the ``vllm``
package, which upstream's wheel owns. Development links them into that package
and the product, the fork wheel, merges them into it (see tools/fork/).
"""

from setuptools import setup

setup(packages=[], py_modules=[])
