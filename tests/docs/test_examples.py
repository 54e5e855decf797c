"""Every shell and Python example of README.md and docs/*.md runs against a real server,
and what it prints is what the page says it prints (the convention: tests/docs/blocks.py).

One ``datarax-serve`` process (8 simulated CPU devices, its own SQLite file) serves the
whole module; each block runs in a fresh folder with ``BASE`` and the README's addresses
pointed at it. ``XLA_FLAGS`` is taken out of the blocks' environment, so an example that
needs simulated devices has to say so itself, as a reader's shell would need it to.
Each block's wall time is printed (``pytest -s`` shows it), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs import blocks
from tests.helpers import ServiceProcess

BLOCK_TIMEOUT_S = 180
ALL_BLOCKS = [
    block
    for path in blocks.doc_files()
    for block in blocks.parse_blocks(path.read_text(), blocks._rel(path))
]
RUNNABLE = [block for block in ALL_BLOCKS if block.runs]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("docs-server")
    service = ServiceProcess(folder / "datarax.sqlite", folder / "server.log")
    with service:
        service.wait_ready()
        yield service


def _venv() -> Path:
    """The folder holding the interpreter the tests run with (``.venv`` in a checkout)."""
    return (
        Path(sys.executable).resolve().parent.parent
        if sys.prefix == sys.base_prefix
        else (Path(sys.prefix))
    )


def _block_env(base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({"BASE": base_url, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"})
    env.pop("DATARAX_API_TOKEN", None)
    return env


def run_block(block: blocks.Block, base_url: str, folder: Path) -> tuple[dict[int, str], str]:
    """Runs ``block`` in ``folder``; returns what printed before each ``# ->`` mark and the
    whole output. Fails the test on a non-zero exit or a timeout, with the output."""
    (folder / ".venv").symlink_to(_venv(), target_is_directory=True)
    code = blocks.point_at(block.body, base_url)
    block = blocks.Block(block.path, block.line, block.info, code, block.expectations)
    marks, out = folder / ".marks", folder / ".out"
    if blocks.RUN_LANGUAGES[block.language] == "bash":
        script = folder / ".block.sh"
        script.write_text(blocks.bash_script(block, str(marks), str(out)))
        command = ["bash", str(script)]
    else:
        script = folder / ".block.py"
        script.write_text(blocks.python_script(block, str(marks)))
        command = [sys.executable, str(script)]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            env=_block_env(base_url),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{block.id} ran past {BLOCK_TIMEOUT_S} s:\n{err.stdout}\n{err.stderr}")
    wall = time.monotonic() - started
    print(f"\n{block.id} ({block.language}): {wall:.2f} s")
    if blocks.RUN_LANGUAGES[block.language] == "bash":
        printed = out.read_text() if out.exists() else ""
        marks_text = marks.read_text() if marks.exists() else ""
        segments = blocks.segments_from_bash(printed, marks_text)
    else:
        printed = done.stdout
        saved = json.loads(marks.read_text()) if marks.exists() else {"text": "", "marks": {}}
        segments = blocks.segments_from_python(saved)
    if done.returncode != 0:
        pytest.fail(
            f"{block.id} exited {done.returncode}\n--- stdout\n{printed[-3000:]}"
            f"\n--- stderr\n{done.stderr[-3000:]}"
        )
    return segments, printed


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_example_runs_and_prints_what_the_page_shows(block, server, tmp_path):
    segments, printed = run_block(block, server.base_url, tmp_path)
    problems = []
    for index, expectation in enumerate(block.expectations):
        if index not in segments:
            problems.append(f"line {expectation.line}: never reached (no output mark)")
            continue
        for why in blocks.compare_output(expectation.text, segments[index]):
            problems.append(f"line {expectation.line}: {why}\n  shown: {expectation.text}")
    if blocks.RUN_LANGUAGES[block.language] == "bash":
        # Segments cover the output from its start to the last mark; the rest is unchecked.
        checked = len("".join(segments.values()).encode())
        unchecked = printed.encode()[checked:].decode(errors="replace")
        for problem in blocks.problems_in(unchecked):
            problems.append(f"answered an error no '# ->' line shows: {problem}")
    assert not problems, f"{block.id}:\n" + "\n".join(problems)


def test_the_pages_hold_examples_to_run():
    """Guards the collector: a parser that found nothing would pass every test above."""
    readme = [b for b in RUNNABLE if b.path == "README.md"]
    assert len(readme) >= 5, [b.id for b in readme]
    assert sum(len(b.expectations) for b in RUNNABLE) >= 20
    assert {b.path for b in RUNNABLE} >= {"README.md", "docs/API.md", "docs/PLANNING.md"}
