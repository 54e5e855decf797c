"""The pages themselves: the README's size and first screen, the example convention
(tests/docs/blocks.py) and its checker, and that every file the pages name exists."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.docs import blocks

README = blocks.ROOT / "README.md"
PAGES = blocks.doc_files()
ALL_BLOCKS = [b for p in PAGES for b in blocks.parse_blocks(p.read_text(), blocks._rel(p))]
SHOWN_LANGUAGES = {"", "json", "yaml", "text", "http", "toml", "dockerfile", "mermaid"}
MAX_EXEMPT = 10


def test_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines < 400, f"README.md has {lines} lines; move reference material to docs/"


def test_readme_first_screen_answers_a_new_user():
    first = "\n".join(README.read_text().splitlines()[:70])
    for needed in ("make run", "make test", '"hardware"', "/v1/recommendations", "/v1/jobs/"):
        assert needed in first, needed
    assert "http://127.0.0.1:8000/" in first, "the dashboard's address"


@pytest.mark.parametrize(
    "page",
    ["API", "ERRORS", "SETTINGS", "CACHING", "MULTIHOST", "LIMITS", "UPSTREAM"],
)
def test_readme_links_each_reference_page(page):
    assert f"](docs/{page}.md)" in README.read_text(), page
    assert (blocks.ROOT / "docs" / f"{page}.md").exists()


@pytest.mark.parametrize("page", PAGES, ids=[blocks._rel(p) for p in PAGES])
def test_every_named_file_exists(page):
    assert not blocks.broken_references(page), blocks.broken_references(page)


def test_every_block_follows_the_convention():
    problems = []
    for block in ALL_BLOCKS:
        if block.language not in blocks.RUN_LANGUAGES and block.language not in SHOWN_LANGUAGES:
            problems.append(f"{block.id}: unknown tag {block.info!r}")
        if block.exempt and not block.body.startswith(blocks.NO_RUN_REASON):
            problems.append(f"{block.id}: no-run without '{blocks.NO_RUN_REASON} <reason>'")
        if block.exempt and len(block.body.splitlines()[0]) <= len(blocks.NO_RUN_REASON) + 3:
            problems.append(f"{block.id}: the no-run reason is empty")
        if block.language in blocks.RUN_LANGUAGES:
            problems += [
                f"{block.id}: '# ->' after code: {x}" for x in blocks.misplaced_expectations(block)
            ]
        if not block.runs and block.expectations:
            problems.append(f"{block.id}: shows outputs but is not run")
    assert not problems, "\n".join(problems)


def test_base_is_defined_once_in_the_readme():
    defined = [
        b.id
        for b in ALL_BLOCKS
        if b.runs and any(line.startswith("BASE=") for line in b.body.splitlines())
    ]
    assert len(defined) == 1 and defined[0].startswith("README.md:"), defined
    uses = [b for b in ALL_BLOCKS if b.runs and "$BASE" in b.body]
    assert len(uses) >= 15, "the examples should reach the service through $BASE"


def test_exemptions_are_few():
    exempt = [b.id for b in ALL_BLOCKS if b.exempt]
    assert len(exempt) <= MAX_EXEMPT, exempt


# ------------------------------------------------------------------ the checker itself

DRIFT_CASES = [
    # (shown, answered, matches)
    ('{"devices_per_host": 4}', '{"name": "tpu-v5e", "devices_per_host": 4}', True),
    ('{"devices_per_host": 8}', '{"name": "tpu-v5e", "devices_per_host": 4}', False),
    ('{"bytes_per_s": 6.25e9}', '{"bytes_per_s": 6250000000.0}', True),
    ('{"bytes_per_s": 3.125e9}', '{"bytes_per_s": 6250000000.0}', False),
    ('{"step_s": 3.75}', '{"step_s": 3.7512}', True),
    ('{"step_s": 3.75}', '{"step_s": 3.7561}', False),
    ('{"loss": 1.0}', '{"loss": 1.02}', True),
    ('{"loss": 1.00}', '{"loss": 1.02}', False),
    ('{"fits": true}', '{"fits": false}', False),
    ('{"fits": true}', '{"fits": 1}', False),
    ('{"a": {"b": [1, 2]}}', '{"a": {"b": [1, 2], "c": 3}}', True),
    ('{"a": {"b": [1, 2]}}', '{"a": {"b": [1, 2, 3]}}', False),
    ('{"a": [1, "..."]}', '{"a": [1, 2, 3]}', True),
    ('{"a": [2, "..."]}', '{"a": [1, 2, 3]}', False),
    ('{"a": "..."}', '{"a": {"anything": 1}}', True),
    ('{"a": "..."}', '{"b": 1}', False),
    ('{"id": "m_1"}', "[1, 2]", False),
    ("True 28.0 21.0 3.75 1.79", "True 28.01 21.0 3.754 1.79\n", True),
    ("True 28.0 21.0 3.75 1.79", "False 28.0 21.0 3.75 1.79\n", False),
    ("True 28.0 21.0 3.75 1.79", "True 28.0 21.0 3.75\n", False),
    ("(1000,) 8", "(1000,) 8\n", True),
    ("(1000,) 8", "(1000,) 4\n", False),
    ("404 mesh_not_found ...", "404 mesh_not_found no stored plan m_x\n", True),
    ("{'data': 2, 'model': 4}", "{'data': 2, 'model': 4}\n", True),
    ("{'data': 2, 'model': 4}", "{'data': 4, 'model': 2}\n", False),
    ("loss 0.1234", "loss 0.12341\n", True),
    ("loss 0.1234", "loss 0.1299\n", False),
    ("True {'loss': 1.0571}", "True {'loss': 1.0571428571428572}\n", True),
    ("True {'loss': 1.0571}", "True {'loss': 1.0581428571428572}\n", False),
    ("ici_fsdp_parallelism=16 num_slices=2", "ici_fsdp_parallelism=16 num_slices=2\n", True),
    ("ici_fsdp_parallelism=16 num_slices=2", "ici_fsdp_parallelism=8 num_slices=2\n", False),
]


@pytest.mark.parametrize(("shown", "answered", "matches"), DRIFT_CASES)
def test_compare_catches_drift(shown, answered, matches):
    assert (not blocks.compare_output(shown, answered)) is matches


def test_parse_blocks_reads_tags_expectations_and_continuations():
    text = (
        "intro\n"
        "```bash\n"
        "curl -s $BASE/v1/hardware/cpu\n"
        '# -> {"name": "cpu",\n'
        '#     "kind": "cpu"}\n'
        "echo hi  # -> not an expectation\n"
        "```\n"
        "```bash no-run\n"
        "# not run by the tests: needs docker\n"
        "docker build .\n"
        "```\n"
        "```json\n"
        "{}\n"
        "```\n"
    )
    first, second, third = blocks.parse_blocks(text, "x.md")
    assert (first.line, first.runs, first.exempt) == (2, True, False)
    assert [(e.line, e.text) for e in first.expectations] == [(4, '{"name": "cpu", "kind": "cpu"}')]
    assert blocks.misplaced_expectations(first) == ["echo hi  # -> not an expectation"]
    assert (second.runs, second.exempt) == (False, True)
    assert (third.language, third.runs, third.exempt) == ("json", False, False)
    with pytest.raises(ValueError, match="never closed"):
        blocks.parse_blocks("```bash\necho\n", "x.md")


def test_point_at_rewrites_every_address_form():
    code = "B=http://127.0.0.1:8000; curl localhost:8000/x; c('http://localhost:8000')"
    got = blocks.point_at(code, "http://127.0.0.1:5555")
    assert got == "B=http://127.0.0.1:5555; curl 127.0.0.1:5555/x; c('http://127.0.0.1:5555')"


def test_bash_marks_split_the_output(tmp_path):
    block = blocks.parse_blocks(
        "```bash\n"
        "echo one\n"
        "# -> one\n"
        "for i in 1 2; do\n"
        "  printf '{\"i\": %s}' $i\n"
        '  # -> {"i": 1}\n'
        "done\n"
        'echo \'{"type": "t", "title": "x", "status": 409, "code": "step_conflict"}\'\n'
        "```\n",
        "x.md",
    )[0]
    out, marks = tmp_path / "out", tmp_path / "marks"
    script = tmp_path / "s.sh"
    script.write_text(blocks.bash_script(block, str(marks), str(out)))
    subprocess.run(["bash", str(script)], check=True, timeout=30)
    segments = blocks.segments_from_bash(out.read_text(), marks.read_text())
    assert segments == {0: "one\n", 1: '{"i": 1}'}  # the loop's first pass counts
    rest = out.read_text()[len("".join(segments.values())) :]
    assert [p["code"] for p in blocks.problems_in(rest)] == ["step_conflict"]


def test_bash_blocks_stop_at_the_first_failure(tmp_path):
    block = blocks.parse_blocks("```bash\nfalse | cat\necho after\n```\n", "x.md")[0]
    script = tmp_path / "s.sh"
    script.write_text(blocks.bash_script(block, str(tmp_path / "m"), str(tmp_path / "o")))
    done = subprocess.run(["bash", str(script)], timeout=30)
    assert done.returncode != 0
    assert "after" not in (tmp_path / "o").read_text()


def test_python_marks_work_inside_indented_code(tmp_path):
    block = blocks.parse_blocks(
        "```python\n"
        "print('a')\n"
        "# -> a\n"
        "with open(__file__) as f:\n"
        "    for k in range(3):\n"
        "        print(k)\n"
        "        # -> 0\n"
        "```\n",
        "x.md",
    )[0]
    marks = tmp_path / "marks.json"
    script = tmp_path / "s.py"
    script.write_text(blocks.python_script(block, str(marks)))
    subprocess.run([sys.executable, str(script)], check=True, timeout=30, capture_output=True)
    assert blocks.segments_from_python(json.loads(marks.read_text())) == {0: "a\n", 1: "0\n"}


def test_json_documents_splits_concatenated_bodies():
    text = 'x {"a": 1}{"b": [2]}\n[3] not json {'
    assert blocks.json_documents(text) == [{"a": 1}, {"b": [2]}, [3]]


def test_references_to_missing_files_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "errors.py").write_text("")
    page = tmp_path / "docs" / "P.md"
    page.write_text(
        "see [errors](ERRORS.md), `app/errors.py`, `app/missing.py`, DESIGN.md, `GET /v1/x`\n"
    )
    found = blocks.broken_references(page, tmp_path)
    assert len(found) == 3, found
    assert any("ERRORS.md" in f for f in found)
    assert any("app/missing.py" in f for f in found)
    assert any("outside the repository" in f for f in found)


def test_every_setting_is_documented():
    """Each ``app.core.settings.Settings`` field has its ``DATARAX_*`` variable in SETTINGS.md."""
    from app.core.settings import Settings

    page = (blocks.ROOT / "docs" / "SETTINGS.md").read_text()
    missing = [f"DATARAX_{name.upper()}" for name in Settings.model_fields
               if f"`DATARAX_{name.upper()}`" not in page]  # fmt: skip
    assert not missing, f"docs/SETTINGS.md lacks {missing}"
