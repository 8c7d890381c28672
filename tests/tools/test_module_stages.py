# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A new module as an earlier patch adds it: the later definitions go with
every statement that uses them and the imports only they used."""

import textwrap

import pytest

from tools.fork.module_stages import earlier_stage

FINAL = textwrap.dedent(
    '''
    """A module."""

    import dataclasses
    import enum
    from collections.abc import Iterable, Sequence

    # The fallback's minimum.
    LIMIT = 89


    class Kind(enum.Enum):
        A = "a"
        B = "b"


    @dataclasses.dataclass
    class Plan:
        kind: Kind
        # Why the fallback runs.
        note: str | None = None

        def pages(self, sizes: Iterable[int]) -> list[int]:
            if self.kind is Kind.B:
                return []
            return list(sizes)


    def plan(major: int) -> Plan:
        if major == 10:
            return Plan(Kind.A)
        if major >= LIMIT:
            return _fallback()
        raise ValueError(major)


    def _fallback() -> Plan:
        return Plan(Kind.B, note="fallback")


    def check(heads: Sequence[int], chosen: Plan) -> None:
        if chosen.note:
            print(chosen.note)
    '''
).lstrip()

EARLIER = textwrap.dedent(
    '''
    """A module."""

    import dataclasses
    import enum
    from collections.abc import Iterable


    class Kind(enum.Enum):
        A = "a"


    @dataclasses.dataclass
    class Plan:
        kind: Kind

        def pages(self, sizes: Iterable[int]) -> list[int]:
            return list(sizes)


    def plan(major: int) -> Plan:
        if major == 10:
            return Plan(Kind.A)
        raise ValueError(major)
    '''
).lstrip()


def test_later_definitions_go_with_their_uses_and_imports():
    removed = ["LIMIT", "Kind.B", "Plan.note", "_fallback", "check"]
    assert earlier_stage(FINAL, removed) == EARLIER


def test_nothing_removed_is_the_final_module():
    assert earlier_stage(FINAL, []) == FINAL


def test_an_unknown_name_fails():
    with pytest.raises(ValueError, match="no definition of \\['Plan.missing'\\]"):
        earlier_stage(FINAL, ["Plan.missing"])


def test_a_function_left_empty_fails():
    with pytest.raises(ValueError, match="empties this block"):
        earlier_stage("def f():\n    g()\n\n\ndef g():\n    pass\n", ["g"])
