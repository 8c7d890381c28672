# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest


@pytest.fixture
def set_capability(monkeypatch):
    """Make vLLM's platform report a GPU of the given compute capability.

    Patched on the platform class, where vLLM's capability helpers
    (``is_device_capability_family`` and friends) look it up.
    """
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    def set_to(major: int, minor: int) -> DeviceCapability:
        capability = DeviceCapability(major, minor)
        monkeypatch.setattr(
            type(current_platform),
            "get_device_capability",
            classmethod(lambda cls, device_id=0: capability),
        )
        return capability

    return set_to
