# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report answers for the GPU it is given without asking vLLM's
platform which GPU this is, and leaves the platform as it found it."""

import ast
import json
from pathlib import Path

import pytest

from vllm_dsv41_plan import report

CAPABILITIES = ["9.0", "10.0", "12.0", "12.1"]


def _platform_classes():
    from vllm.platforms import current_platform

    return [c for c in type(current_platform).__mro__ if c is not object]


def _snapshot() -> dict[type, dict[str, object]]:
    return {cls: dict(vars(cls)) for cls in _platform_classes()}


def _answers(capsys) -> dict[str, dict]:
    answers = {}
    for capability in CAPABILITIES:
        code = report.main(["plan", "--capability", capability, "--json"])
        answers[capability] = json.loads(capsys.readouterr().out)
        assert code == 0, answers[capability]["error"]
    return answers


def test_planning_replaces_no_platform_attribute(capsys):
    from vllm.platforms import current_platform

    before = _snapshot()
    capability = current_platform.get_device_capability()
    _answers(capsys)
    after = _snapshot()
    for cls, attributes in before.items():
        assert after[cls].keys() == attributes.keys(), cls
        for name, value in attributes.items():
            assert after[cls][name] is value, f"{cls.__name__}.{name} was replaced"
    assert current_platform.get_device_capability() == capability


def test_the_report_answers_while_the_platform_refuses_to(capsys, monkeypatch):
    """With the platform's capability query raising, the report gives the
    same answers for every GPU; and while it negotiates and builds the specs
    the query is still the raising one (no replacement for the duration)."""
    from vllm.models.deepseek_v41.nvidia import sparse_mla_pages
    from vllm.platforms import current_platform

    expected = _answers(capsys)  # also imports the model modules
    platform_cls = type(current_platform)

    def refuse(cls, device_id=0):
        raise AssertionError("the plan report asked the platform for its GPU")

    monkeypatch.setattr(platform_cls, "get_device_capability", classmethod(refuse))
    refusing = vars(platform_cls)["get_device_capability"]
    checked = []

    def while_refusing(function):
        def call(*args, **kwargs):
            assert vars(platform_cls)["get_device_capability"] is refusing
            checked.append(function.__name__)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(
        sparse_mla_pages,
        "negotiate_for_model",
        while_refusing(sparse_mla_pages.negotiate_for_model),
    )
    monkeypatch.setattr(report, "cache_specs", while_refusing(report.cache_specs))
    with pytest.raises(AssertionError, match="asked the platform"):
        current_platform.get_device_capability()
    assert _answers(capsys) == expected
    assert checked == ["negotiate_for_model", "cache_specs"] * len(CAPABILITIES)


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def test_the_report_holds_no_run_time_binding():
    """Its source assigns no attribute of anything it imports (only of its
    own report objects), calls no setattr and names no platform."""
    tree = ast.parse(Path(report.__file__).read_text())
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "DeviceCapability" in imported  # the walk sees the imports
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute):
                root = _root(target)
                assert isinstance(root, ast.Name) and root.id not in imported, (
                    ast.unparse(node)
                )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("setattr", "delattr"), ast.unparse(node)
        if isinstance(node, ast.Name):
            assert "platform" not in node.id, node.id
        if isinstance(node, ast.alias):
            assert "current_platform" not in node.name, node.name
