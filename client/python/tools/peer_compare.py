"""Compares two runs of Emerging-Optimizers' upstream tests (scripts/peer_tests.sh): against EO itself (the
baseline) and with EO's newton_schulz replaced by orthoserve's (tools/eo_plugin.py).

    python peer_compare.py BASELINE_DIR ORTHOSERVE_DIR [--numerics docs/numerics.md]

Each directory holds pytest JUnit XML files, one per test file (`<test file stem>.xml`; a torchrun file has one per
rank, `<stem>-rank<R>.xml`, and a test passes only when it passes on every rank). Prints a table per test file and
every test that passed on the baseline but not through orthoserve, classified:
  - tolerance-only: the failure is a numeric comparison (torch.testing.assert_close, assertLess/assertGreater and
    friends) — printed with the measured error from the message; each must be listed in docs/numerics.md (its test
    id, `file::Class::test`), with its measured error;
  - other: anything else (an exception, a wrong exception type, a wrong shape) — a regression.
Exit status: 0 when there is no regression and every tolerance-only failure is listed; 1 otherwise; 2 when a run's
results are missing.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
_TOLERANCE = [
    re.compile(r"(Tensor-likes|Scalars) are not (close|equal)!"),
    re.compile(r"AssertionError: .* not (less|greater) than( or equal to)? "),
    re.compile(r"AssertionError: .* (!=|==) .* within .* delta"),
]
_MEASURED = re.compile(r"^\s*(?:E\s+)?(Greatest (?:absolute|relative) difference: .*|Mismatched elements: .*|"
                       r"AssertionError: .*not (?:less|greater) than.*)$", re.M)


def _read(path: pathlib.Path) -> Dict[str, Tuple[str, str]]:
    """test id -> (outcome, failure text) of one JUnit XML file."""
    out = {}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        module, _, cls = case.get("classname", "").partition(".")
        test_id = f"{module}.py::{cls}::{case.get('name')}" if cls else f"{module}.py::{case.get('name')}"
        outcome, text = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = FAILED
                text = (child.get("message") or "") + "\n" + (child.text or "")
                break
            if child.tag == "skipped":
                outcome = SKIPPED
        out[test_id] = (outcome, text)
    return out


def read_run(directory: pathlib.Path) -> Dict[str, Tuple[str, str]]:
    """test id -> (outcome, failure text) over every XML file of a run; a test run on several ranks has the worst
    outcome of its ranks (failed > passed > skipped) and the failing ranks named in its text."""
    merged: Dict[str, List[Tuple[str, str, str]]] = collections.defaultdict(list)
    files = sorted(directory.glob("*.xml"))
    if not files:
        raise FileNotFoundError(f"no JUnit XML files in {directory}")
    for f in files:
        rank = re.search(r"-rank(\d+)$", f.stem)
        for test_id, (outcome, text) in _read(f).items():
            merged[test_id].append((outcome, text, rank.group(1) if rank else ""))
    out = {}
    for test_id, results in merged.items():
        failed = [(t, r) for o, t, r in results if o == FAILED]
        if failed:
            ranks = [r for _, r in failed if r]
            note = f"[failed on rank(s) {', '.join(ranks)}]\n" if ranks else ""
            out[test_id] = (FAILED, note + failed[0][0])
        elif any(o == PASSED for o, _, _ in results):
            out[test_id] = (PASSED, "")
        else:
            out[test_id] = (SKIPPED, "")
    return out


def is_tolerance(text: str) -> bool:
    return any(p.search(text) for p in _TOLERANCE)


def measured(text: str) -> str:
    lines = dict.fromkeys(m.strip() for m in _MEASURED.findall(text))  # The message and the text repeat them.
    return "; ".join(lines) or text.strip().splitlines()[0][:200]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=pathlib.Path)
    parser.add_argument("orthoserve", type=pathlib.Path)
    parser.add_argument("--numerics", type=pathlib.Path, help="docs/numerics.md: must list every tolerance-only "
                        "failure by test id")
    args = parser.parse_args(argv)
    try:
        base, ours = read_run(args.baseline), read_run(args.orthoserve)
    except (FileNotFoundError, ET.ParseError) as e:
        print(f"peer_compare: {e}", file=sys.stderr)
        return 2

    by_file: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for test_id in sorted(set(base) | set(ours)):
        f = test_id.split("::")[0]
        by_file[f][("eo", base.get(test_id, ("missing", ""))[0])] += 1
        by_file[f][("os", ours.get(test_id, ("missing", ""))[0])] += 1
    header = f"{'test file':38} {'EO pass/fail/skip':>18} {'orthoserve pass/fail/skip':>26}"
    print(header)
    print("-" * len(header))
    totals = collections.Counter()
    for f, c in sorted(by_file.items()):
        eo = f"{c[('eo', PASSED)]}/{c[('eo', FAILED)]}/{c[('eo', SKIPPED)]}"
        os_ = f"{c[('os', PASSED)]}/{c[('os', FAILED)]}/{c[('os', SKIPPED)]}"
        print(f"{f:38} {eo:>18} {os_:>26}")
        totals.update(c)
    eo = f"{totals[('eo', PASSED)]}/{totals[('eo', FAILED)]}/{totals[('eo', SKIPPED)]}"
    os_ = f"{totals[('os', PASSED)]}/{totals[('os', FAILED)]}/{totals[('os', SKIPPED)]}"
    print("-" * len(header))
    print(f"{'total':38} {eo:>18} {os_:>26}")

    regressions, tolerance = [], []
    for test_id, (outcome, _) in sorted(base.items()):
        if outcome != PASSED:
            continue
        ours_outcome, text = ours.get(test_id, ("missing", "not run through orthoserve"))
        if ours_outcome == PASSED:
            continue
        if ours_outcome == FAILED and is_tolerance(text):
            tolerance.append((test_id, measured(text)))
        else:
            regressions.append((test_id, ours_outcome, measured(text) if text else ours_outcome))
    only_ours = [t for t, (o, _) in sorted(ours.items()) if o == PASSED and base.get(t, ("", ""))[0] == FAILED]

    print()
    print(f"passed against EO: {totals[('eo', PASSED)]}; of them through orthoserve: "
          f"{totals[('eo', PASSED)] - len(tolerance) - len(regressions)} passed, {len(tolerance)} tolerance-only "
          f"failures, {len(regressions)} other failures")
    listed = args.numerics.read_text() if args.numerics else None
    unlisted = []
    for test_id, error in tolerance:
        mark = ""
        if listed is not None and test_id not in listed:
            unlisted.append(test_id)
            mark = "  [NOT LISTED in docs/numerics.md]"
        print(f"  tolerance-only: {test_id}: {error}{mark}")
    for test_id, outcome, error in regressions:
        print(f"  REGRESSION ({outcome}): {test_id}: {error}")
    for test_id in only_ours:
        print(f"  passed through orthoserve, failed against EO: {test_id}")
    if regressions or unlisted:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
