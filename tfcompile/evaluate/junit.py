"""`--junit FILE`: the gates as a JUnit XML report, one test case per gate.

CI systems (GitHub Actions test reporters, GitLab's `artifacts:reports:junit`, Jenkins' junit
step) show each figure gate (--max-kl, ...) and each task gate (--max-task-drop, one per task)
as a test; a missed gate is a failed case whose message holds the measured value and the limit.
Written atomically (a temp file renamed into place), UTF-8, deterministic (no timestamps).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from tfcompile.evaluate.gates import figure_failure, task_failure
from tfcompile.io.jsonfile import write_bytes

SUITE = "tfcompile.gates"


def cases(gates: list[dict], tasks: list[dict]) -> list[tuple[str, str | None]]:
    """(test case name, failure message or None) per gate, figure gates first."""
    out = [(f"{g['gate']} ({g['metric']} {g['value']:.6g} vs {g['threshold']:g})"
            if g["value"] is not None else f"{g['gate']} ({g['metric']})",
            None if g["ok"] else figure_failure(g)) for g in gates]
    out += [(f"max-task-drop {t['task']} ({t['metric']} {t['reference']:.4g} -> {t['candidate']:.4g})",
             None if t["passed"] else task_failure(t)) for t in tasks]
    return out


def junit_xml(gates: list[dict], tasks: list[dict], name: str) -> bytes:
    """The document: one <testsuite name=SUITE> of one <testcase> per gate (classname = `name`)."""
    rows = cases(gates, tasks)
    suites = ET.Element("testsuites", tests=str(len(rows)), failures=str(sum(m is not None for _, m in rows)))
    suite = ET.SubElement(suites, "testsuite", name=SUITE, tests=suites.get("tests"),
                          failures=suites.get("failures"), errors="0", skipped="0")
    for case, message in rows:
        tc = ET.SubElement(suite, "testcase", classname=name, name=case)
        if message is not None:
            ET.SubElement(tc, "failure", message=message, type="GateFailed").text = message
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: Path, gates: list[dict], tasks: list[dict], name: str) -> None:
    """Write the report at `path` atomically (tfcompile.io: a temp sibling renamed; the umask's mode)."""
    write_bytes(Path(path), junit_xml(gates, tasks, name), atomic=True)
