# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The dev venv the tests run in is the pinned base as its metadata asks for
it, so what passes here is what a user's install runs."""

import importlib.metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.fork.common import load_pin


def test_dev_venv_holds_the_pins_and_vllms_requirements():
    pin = load_pin()
    assert importlib.metadata.version("vllm") == pin.VLLM_VERSION
    assert importlib.metadata.version("torch").split("+")[0] == pin.TORCH_VERSION
    assert importlib.metadata.version("flashinfer-python") == pin.FLASHINFER_VERSION
    removed = {canonicalize_name(name) for name in pin.INCOMPATIBLE_PACKAGES}
    unmet = []
    for line in importlib.metadata.requires("vllm"):
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in removed:
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{requirement} (installed: {version})")
    assert unmet == []
