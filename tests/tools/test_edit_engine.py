# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The in-place edit engine on small sources written here, each expected
result spelled out by hand."""

import textwrap

import pytest

from tools.fork.edit_engine import (
    ADD_TO_CLASS,
    INSERT_AFTER,
    INSERT_BEFORE,
    REPLACE,
    REPLACE_BODY,
    REPLACE_STATEMENT,
    Edit,
    EditError,
    apply_edit,
    apply_edits,
)

SOURCE = textwrap.dedent(
    '''
    import os


    class Cache:
        size = 32

        def build(self, n):
            """Build it."""
            self.pages = make(block=32, n=n)
            if n > 2:
                return n
            return 0


    def helper(x):
        return x + 1
    '''
).lstrip()


def _edit(scope, action, text, anchor=None, **kw) -> Edit:
    return Edit("pkg/mod.py", scope, action, text, "pages", "test", anchor, **kw)


def test_replace_anchor_keeps_the_rest():
    out = apply_edit(
        SOURCE, _edit("Cache.build", REPLACE, "block=ask()", "block=32"), "1"
    )
    assert "self.pages = make(block=ask(), n=n)\n" in out
    assert out.replace("block=ask()", "block=32") == SOURCE


def test_multiline_replacement_is_indented_at_the_anchor_line():
    edit = _edit("Cache.build", REPLACE, "return (\n    a\n    or b\n)", "return 0")
    out = apply_edit(SOURCE, edit, "1")
    assert "        return 0" not in out
    assert "        return (\n            a\n            or b\n        )\n" in out


def test_insert_before_and_after_the_anchor_statement():
    before = _edit("Cache.build", INSERT_BEFORE, "check(n)", "if n > 2")
    after = _edit("Cache.build", INSERT_AFTER, "log(n)", "if n > 2")
    out = apply_edits(lambda p: SOURCE, [before, after], "1")["pkg/mod.py"]
    # Before the whole if statement, and after its last line, at its indent.
    assert (
        "        check(n)\n        if n > 2:\n            return n\n        log(n)\n"
        in (out)
    )


def test_insert_around_a_dict_entry():
    """An anchor that starts a key of a dict display places the insertion
    around that entry (a registry such as vllm/envs.py's), not around the
    whole assignment."""
    source = textwrap.dedent(
        """
        table = {
            "a": lambda: (
                1
            ),
            "b": lambda: 2,
        }
        """
    ).lstrip()
    before = _edit("", INSERT_BEFORE, '"x": lambda: 0,', '"b": lambda')
    after = _edit("", INSERT_AFTER, '"y": lambda: 9,', '"a": lambda')
    out = apply_edits(lambda p: source, [before, after], "1")["pkg/mod.py"]
    assert out == (
        "table = {\n"
        '    "a": lambda: (\n'
        "        1\n"
        "    ),\n"
        '    "y": lambda: 9,\n'
        '    "x": lambda: 0,\n'
        '    "b": lambda: 2,\n'
        "}\n"
    )


def test_add_to_class_and_replace_body():
    add = _edit("Cache", ADD_TO_CLASS, "def extra(self):\n    return 1")
    body = _edit("helper", REPLACE_BODY, "return x * 2")
    out = apply_edits(lambda p: SOURCE, [add, body], "1")["pkg/mod.py"]
    assert "        return 0\n\n    def extra(self):\n        return 1\n" in out
    assert out.endswith("def helper(x):\n    return x * 2\n")


def test_replace_body_keeps_the_docstring():
    out = apply_edit(SOURCE, _edit("Cache.build", REPLACE_BODY, "pass"), "1")
    assert '        """Build it."""\n        pass\n' in out
    assert "make(" not in out


def test_deleting_a_statement_leaves_no_blank_line():
    out = apply_edit(SOURCE, _edit("", REPLACE, "", "import os"), "1")
    assert out.startswith("\n\nclass Cache:") or out.startswith("\nclass Cache:")
    assert "import os" not in out


def test_replace_statement_takes_the_whole_block():
    edit = _edit("Cache.build", REPLACE_STATEMENT, "n = min(n, 2)", "if n > 2")
    out = apply_edit(SOURCE, edit, "1")
    assert "        self.pages = make(block=32, n=n)\n        n = min(n, 2)\n" in out
    assert "if n > 2" not in out and "return n\n" not in out
    gone = apply_edit(SOURCE, _edit("Cache.build", REPLACE_STATEMENT, "", "if n"), "1")
    assert "make(block=32, n=n)\n        return 0\n" in gone


def test_module_level_definition_gets_pep8_spacing():
    edit = _edit("", INSERT_AFTER, "class Extra(Cache):\n    pass", "class Cache:")
    out = apply_edit(SOURCE, edit, "1")
    assert "        return 0\n\n\nclass Extra(Cache):\n    pass\n\n\ndef helper" in out


def test_anchor_per_base():
    edit = _edit("helper", REPLACE, "x - 1", {"1": "x + 1", "2": "x + 2"})
    assert "return x - 1" in apply_edit(SOURCE, edit, "1")
    with pytest.raises(EditError, match="no anchor for vLLM 3"):
        apply_edit(SOURCE, edit, "3")


def test_edit_limited_to_some_bases():
    edit = _edit("helper", REPLACE, "x - 1", "x + 1", bases=("2",))
    assert apply_edits(lambda p: SOURCE, [edit], "1") == {}
    assert "x - 1" in apply_edits(lambda p: SOURCE, [edit], "2")["pkg/mod.py"]


@pytest.mark.parametrize(
    "edit, message",
    [
        # The anchor exists in the file but not inside the named scope.
        (
            _edit("helper", REPLACE, "y", "block=32"),
            "pkg/mod.py: helper: anchor 'block=32' not found",
        ),
        (
            _edit("Cache.build", REPLACE, "y", "return"),
            "pkg/mod.py: Cache.build: anchor 'return' found 2 times",
        ),
        (
            _edit("Cache.missing", REPLACE, "y", "x"),
            "pkg/mod.py: Cache.missing: scope 'missing' not found",
        ),
        (
            _edit("helper", ADD_TO_CLASS, "y = 1"),
            "pkg/mod.py: helper: is not a class",
        ),
        (
            _edit("helper", REPLACE, "(", "x + 1"),
            "pkg/mod.py: helper: the edit leaves invalid Python",
        ),
    ],
)
def test_failures_name_file_scope_and_anchor(edit, message):
    with pytest.raises(EditError) as info:
        apply_edit(SOURCE, edit, "1")
    assert str(info.value).startswith(message)


def test_duplicate_scope_is_refused():
    source = SOURCE + "\n\ndef helper(y):\n    return y\n"
    with pytest.raises(EditError, match="scope 'helper' defined 2 times"):
        apply_edit(source, _edit("helper", REPLACE, "z", "return"), "1")


def test_anchor_required_exactly_for_anchored_actions():
    with pytest.raises(ValueError, match="needs an anchor"):
        _edit("helper", REPLACE, "x")
    with pytest.raises(ValueError, match="takes no anchor"):
        _edit("Cache", ADD_TO_CLASS, "x = 1", "size")
