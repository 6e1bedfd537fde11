#!/usr/bin/env python3
"""The import-circle check finds the circles of a tiny fixture tree (scripts/testdata/
import-circles/, its README lists them), none of its look-alikes, and enforces its allow-list
both ways.

    python3 scripts/test_check_import_circles.py
"""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECK = HERE / "check-import-circles.py"
FIXTURE = HERE / "testdata" / "import-circles"
CIRCLES = [
    "crates/demo/src/a.rs crates/demo/src/b.rs",
    "crates/demo/src/d.rs crates/demo/src/e.rs",
    "scripts/x.py scripts/y.py",
]


def check(allow_lines: list[str]) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as allow:
        allow.write("".join(line + "\n" for line in allow_lines))
    try:
        return subprocess.run(
            [sys.executable, str(CHECK), "--root", str(FIXTURE), "--allow", allow.name],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        Path(allow.name).unlink()


class CheckImportCircles(unittest.TestCase):
    def test_reports_exactly_the_three_circles(self):
        run = check([])
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        found = [line.removeprefix("import circle: ") for line in run.stdout.splitlines() if line.startswith("import circle: ")]
        self.assertEqual(found, CIRCLES)
        self.assertIn("11 files, 9 imports, 3 circles (0 allowed)", run.stdout)

    def test_allowed_circles_pass(self):
        # The files of an entry may be listed in any order.
        run = check(["# a comment", "", "owner-a: crates/demo/src/b.rs crates/demo/src/a.rs"] + [f"owner-b: {c}" for c in CIRCLES[1:]])
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("allowed import circle (owner owner-a,", run.stdout)

    def test_a_circle_gone_from_the_tree_fails_its_entry(self):
        stale = "owner-c: crates/demo/src/c.rs crates/demo/src/op/cpu.rs"
        run = check([f"owner: {c}" for c in CIRCLES] + [stale])
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("stale allow-list entry", run.stdout)
        self.assertIn("(owner owner-c): crates/demo/src/c.rs crates/demo/src/op/cpu.rs is no longer a circle", run.stdout)

    def test_a_part_of_a_circle_is_not_the_circle(self):
        # An entry must name the whole component: a smaller circle needs its own, smaller entry.
        run = check(["owner: crates/demo/src/a.rs crates/demo/src/b.rs crates/demo/src/c.rs"] + [f"owner: {c}" for c in CIRCLES[1:]])
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("import circle: crates/demo/src/a.rs crates/demo/src/b.rs", run.stdout)

    def test_a_bad_entry_is_refused_in_one_line(self):
        run = check(["crates/demo/src/a.rs crates/demo/src/b.rs"])
        self.assertEqual(run.returncode, 2)
        self.assertIn(":1: expected `owner: file file …`", run.stderr)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1)

    def test_a_path_attribute_places_its_file(self):
        # `#[path]` names a file outside the module tree's folders (a list shared with another
        # crate's tests): it is read, and a circle through it is found.
        with tempfile.TemporaryDirectory() as root:
            src = Path(root) / "crates" / "demo" / "src"
            src.mkdir(parents=True)
            (Path(root) / "shared").mkdir()
            (src / "lib.rs").write_text('mod a;\n#[cfg(test)]\n#[path = "../../../shared/b.rs"]\nmod b;\n')
            (src / "a.rs").write_text("use crate::b::f;\npub struct A;\n")
            (Path(root) / "shared" / "b.rs").write_text("use crate::a::A;\npub fn f(_: A) {}\n")
            run = subprocess.run([sys.executable, str(CHECK), "--root", root], capture_output=True, text=True, check=False)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("import circle: crates/demo/src/a.rs shared/b.rs", run.stdout)
        self.assertIn("3 files, 2 imports, 1 circles", run.stdout)

if __name__ == "__main__":
    unittest.main()
