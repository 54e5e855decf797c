"""One error model: every problem ``code`` the service can answer is in ``app.core.errors.CODES``
and in the error table of ``docs/ERRORS.md``, with one status per code.

Codes are collected from the source itself (``ast``), so a new ``raise`` with a new code
fails here until the registry and the table name it:

- ``code`` class attributes of ``ServiceError`` subclasses, and ``code="..."`` keywords in
  ``app/`` (``ServiceError(detail, code=...)``, ``InvalidBatch(..., code=...)``);
- the first argument of every ``PlanError(...)`` and ``MetricsError(...)`` in ``datarax/``
  (the library's codes, answered as they are).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.core import errors
from app.core.errors import CODES, ServiceError

ROOT = Path(__file__).resolve().parents[3]
ERRORS_DOC = (ROOT / "docs" / "ERRORS.md").read_text()


def _errors_table() -> str:
    """The table's rows: every line of docs/ERRORS.md that starts with ``| `code` |``."""
    return "\n".join(
        line for line in ERRORS_DOC.splitlines() if re.match(r"^\| `[a-z_]+` \|", line)
    )


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _app_codes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in _modules("app"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.keyword) and node.arg == "code":
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    found.setdefault(node.value.value, []).append(where)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.Assign)
                        and [getattr(t, "id", None) for t in item.targets] == ["code"]
                        and isinstance(item.value, ast.Constant)
                    ):
                        found.setdefault(item.value.value, []).append(where)
    return found


def _library_codes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in _modules("datarax"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None))
                in ("PlanError", "MetricsError")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(node.args[0].value, []).append(where)
    return found


def _table_codes() -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", _errors_table(), flags=re.MULTILINE))


def test_the_collectors_find_codes():
    # Guards the collectors themselves: a broken walk would pass every check below.
    assert {"mesh_not_found", "insufficient_memory", "session_lost"} <= set(_app_codes())
    assert {"not_enough_devices", "unknown_reduce_op"} <= set(_library_codes())


@pytest.mark.parametrize("source", ["app", "datarax"])
def test_every_emitted_code_is_in_the_table(source):
    found = _app_codes() if source == "app" else _library_codes()
    missing = {code: where for code, where in found.items() if code not in CODES}
    assert not missing, f"codes raised but not in app.core.errors.CODES: {missing}"


def test_every_code_is_in_the_docs_error_table():
    table = _table_codes()
    assert len(table) > 50, "docs/ERRORS.md's table was not found"
    assert not set(CODES) - table, f"docs/ERRORS.md's table lacks {sorted(set(CODES) - table)}"
    assert not table - set(CODES), f"docs/ERRORS.md lists unknown {sorted(table - set(CODES))}"


def test_docs_statuses_match_the_table():
    section = _errors_table()
    for code, entry in CODES.items():
        row = re.search(rf"^\| `{code}` \| (\d+) \|", section, flags=re.MULTILINE)
        assert row and int(row.group(1)) == entry.status, (code, entry.status)


def test_each_error_class_answers_its_table_status():
    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, ServiceError)
    ]
    assert len(classes) > 20
    for cls in classes:
        assert cls.code in CODES, cls
        if cls.__init__ is ServiceError.__init__:
            error = cls("detail")
            assert (error.status, error.title) == (CODES[cls.code].status, CODES[cls.code].title)


def test_unknown_code_is_a_programming_error():
    with pytest.raises(KeyError, match="not in app.core.errors.CODES"):
        ServiceError("x", code="no_such_code")


def test_reply_round_trip_keeps_code_status_and_extra():
    sent = errors.InsufficientMemory("needs 2 GiB", extra={"need_bytes": 2**31})
    back = errors.from_reply(sent.to_reply())
    assert (back.status, back.code, back.detail, back.extra) == (
        422,
        "insufficient_memory",
        "needs 2 GiB",
        {"need_bytes": 2**31},
    )
