# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The plan report answers for the GPU it is given, whatever GPU (or none)
the host has: the capability goes in at the platform boundary while it plans,
and the platform is left as it was found."""

import ast
import json
from pathlib import Path

import pytest

from tests.plan_report.start_up import two_segment_backend
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
        code = report.main(
            [
                "plan",
                "--attention-backend",
                two_segment_backend(int(capability.split(".")[0])),
                "--capability",
                capability,
                "--json",
            ]
        )
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
    """With the host's capability query raising (as with no GPU), the report
    gives the same answers for every GPU, and the query raises again after."""
    from vllm.platforms import current_platform

    expected = _answers(capsys)  # also imports the model modules

    def refuse(cls, device_id=0):
        raise AssertionError("the plan report asked the host's platform")

    monkeypatch.setattr(
        type(current_platform), "get_device_capability", classmethod(refuse)
    )
    assert _answers(capsys) == expected
    with pytest.raises(AssertionError, match="asked the host's platform"):
        current_platform.get_device_capability()


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def test_the_report_binds_the_platform_in_one_place():
    """Its source assigns no attribute of anything it imports (only of its
    own report objects) outside ``capability_at_platform``, and calls no
    setattr."""
    tree = ast.parse(Path(report.__file__).read_text())
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "DeviceCapability" in imported  # the walk sees the imports
    boundary = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "capability_at_platform"
    )
    inside = {id(node) for node in ast.walk(boundary)}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
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
