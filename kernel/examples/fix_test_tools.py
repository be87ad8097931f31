"""The functions of ``flows/fix-test.json``: ``make_repo`` copies a small Python project with a failing
test into the run's workspace, ``run_tests`` runs its tests.

Load them with ``flowkernel --plugin flowkernel.examples.fix_test_tools ...`` (they ship with flowkernel)
or ``FLOWKERNEL_PLUGINS=flowkernel.examples.fix_test_tools``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from flowkernel.agents.sessions import run_workspace
from flowkernel.plugins.registry import blocking, register_function

# The project: ``add`` subtracts, and its test says so.
REPO: dict[str, str] = {
    "calc.py": '"""Arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n',
    "test_calc.py": ("import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
                     "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
                     "if __name__ == \"__main__\":\n    unittest.main()\n"),
}
TESTS_TIMEOUT_S = 60


@register_function
def make_repo(ctx: Any) -> dict[str, str]:
    """Write the project into ``<the run's workspace>/repo``; returns ``{"path": …}``."""
    folder = run_workspace(ctx.flow_run_id) / "repo"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in REPO.items():
        (folder / name).write_text(text, encoding="utf-8")
    return {"path": str(folder)}


def _run_tests(path: str) -> dict[str, Any]:
    """Run the project's tests; returns ``{"passed", "report"}`` (the failures, without the folder's path
    or timings, so the report reads the same on every machine)."""
    done = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=path, capture_output=True, text=True,
                          timeout=TESTS_TIMEOUT_S)
    lines = (done.stderr + done.stdout).replace(str(Path(path)), ".").splitlines()
    report = [line for line in lines if line.startswith(("AssertionError", "FAILED", "OK"))]
    return {"passed": done.returncode == 0, "report": "\n".join(report)}


run_tests = register_function("run_tests", blocking(_run_tests))
