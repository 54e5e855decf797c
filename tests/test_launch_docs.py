"""docs/LAUNCH.md's examples are what the code answers (rewrite: python -m tests.launch_docs)."""

from __future__ import annotations

from tests import launch_docs


def test_every_launch_example_in_the_docs_is_what_the_code_answers():
    text = launch_docs.PAGE.read_text()
    assert text.count("<!-- generated:") == len(launch_docs.blocks())
    assert launch_docs.render(text) == text, "run: .venv/bin/python -m tests.launch_docs"
    for name, block in launch_docs.blocks().items():
        assert f"<!-- generated: {name} -->\n{block}\n<!-- end: {name} -->" in text, name
