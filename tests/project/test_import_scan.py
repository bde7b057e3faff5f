"""tests/support/import_scan.py, the scan behind tests/project/test_structure.py's rule that no test module imports
another: it sees each form of import (module level, in a function, bare, `from tests import x`) and lets a
support module through unless it defines tests."""

from __future__ import annotations

from pathlib import Path

from tests.support.import_scan import imports_of_test_modules


def test_the_scan_sees_each_form_of_importing_a_test_module(tmp_path: Path):
    files = {"test_a.py": "def h():\n    pass\n", "support/s.py": "def test_x():\n    pass\n", "support/ok.py": "",
             "b/test_b.py": "from tests.test_a import h\nfrom tests.support import ok, s\n",
             "test_c.py": "def f():\n    import test_a\n    from tests import test_a, support\n"}
    for name, text in files.items():
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text(text)
    assert imports_of_test_modules(tmp_path / "tests") == [
        "tests/b/test_b.py:1: tests.test_a", "tests/b/test_b.py:2: tests.support.s", "tests/test_c.py:2: test_a",
        "tests/test_c.py:3: tests.test_a"]
