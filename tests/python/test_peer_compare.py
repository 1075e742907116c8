"""client/python/tools/peer_compare.py (scripts/peer_tests.sh's verdict) on made-up JUnit XML results: a test that
passes against Emerging-Optimizers and fails through orthoserve is a regression unless the failure is a numeric
tolerance listed in docs/numerics.md; a test of a torchrun file fails when any rank fails."""

import importlib.util

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("peer_compare", REPO / "client" / "python" / "tools" / "peer_compare.py")
peer_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer_compare)

CLOSE = ("AssertionError: Tensor-likes are not close!\n\nMismatched elements: 3 / 10 (30.0%)\n"
         "Greatest absolute difference: 0.001 at index (1, 2) (up to 0 allowed)\n"
         "Greatest relative difference: 2e-06 at index (1, 2) (up to 1e-06 allowed)")
CRASH = "TypeError: newton_schulz() got an unexpected keyword argument 'foo'"


def junit(path, cases):
    """cases: (class, name, outcome, text)."""
    body = []
    for cls, name, outcome, text in cases:
        if outcome == "failed":
            inner = f'<failure message="{text.splitlines()[0]}">{text}</failure>'
        else:
            inner = '<skipped message="no GPU"/>' if outcome == "skipped" else ""
        body.append(f'<testcase classname="test_x.{cls}" name="{name}" time="0.1">{inner}</testcase>')
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(body)}</testsuite>'
                    "</testsuites>")


def run(tmp_path, ours_cases, listed="", base_cases=None):
    (tmp_path / "eo").mkdir()
    (tmp_path / "os").mkdir()
    base_cases = base_cases or [(c, n, "skipped" if o == "skipped" else "passed", "") for c, n, o, _ in ours_cases]
    junit(tmp_path / "eo" / "test_x.xml", base_cases)
    junit(tmp_path / "os" / "test_x.xml", ours_cases)
    (tmp_path / "numerics.md").write_text(listed)
    return peer_compare.main([str(tmp_path / "eo"), str(tmp_path / "os"), "--numerics", str(tmp_path / "numerics.md")])


def test_all_passing_is_success(tmp_path, capsys):
    assert run(tmp_path, [("T", "a", "passed", ""), ("T", "b", "skipped", "")]) == 0
    assert "1 passed, 0 tolerance-only failures, 0 other failures" in capsys.readouterr().out


def test_a_tolerance_failure_must_be_listed(tmp_path, capsys):
    cases = [("T", "a", "passed", ""), ("T", "b", "failed", CLOSE)]
    assert run(tmp_path, cases) == 1
    out = capsys.readouterr().out
    assert "tolerance-only: test_x.py::T::b" in out and "Greatest relative difference: 2e-06" in out
    assert "NOT LISTED" in out


def test_a_listed_tolerance_failure_is_accepted(tmp_path):
    cases = [("T", "a", "passed", ""), ("T", "b", "failed", CLOSE)]
    assert run(tmp_path, cases, listed="| `test_x.py::T::b` | rtol 1e-6 | 2e-6 |") == 0


def test_any_other_failure_is_a_regression(tmp_path, capsys):
    assert run(tmp_path, [("T", "a", "failed", CRASH)], listed="test_x.py::T::a") == 1
    assert "REGRESSION (failed): test_x.py::T::a" in capsys.readouterr().out


def test_skipped_through_orthoserve_is_not_passing(tmp_path, capsys):
    assert run(tmp_path, [("T", "a", "skipped", "")], base_cases=[("T", "a", "passed", "")]) == 1
    assert "REGRESSION (skipped): test_x.py::T::a" in capsys.readouterr().out


def test_a_failure_on_the_baseline_is_not_compared(tmp_path):
    base = [("T", "a", "failed", CRASH), ("T", "b", "passed", "")]
    assert run(tmp_path, [("T", "a", "failed", CRASH), ("T", "b", "passed", "")], base_cases=base) == 0


def test_a_torchrun_test_fails_when_one_rank_fails(tmp_path, capsys):
    (tmp_path / "eo").mkdir()
    (tmp_path / "os").mkdir()
    for rank in range(2):
        junit(tmp_path / "eo" / f"test_x-rank{rank}.xml", [("T", "a", "passed", "")])
        junit(tmp_path / "os" / f"test_x-rank{rank}.xml", [("T", "a", "failed" if rank else "passed", CRASH)])
    assert peer_compare.main([str(tmp_path / "eo"), str(tmp_path / "os")]) == 1
    assert "test_x.py::T::a" in capsys.readouterr().out
    merged = peer_compare.read_run(tmp_path / "os")
    assert merged["test_x.py::T::a"][0] == "failed" and "rank(s) 1" in merged["test_x.py::T::a"][1]


def test_missing_results_are_an_error(tmp_path):
    (tmp_path / "eo").mkdir()
    (tmp_path / "os").mkdir()
    assert peer_compare.main([str(tmp_path / "eo"), str(tmp_path / "os")]) == 2


@pytest.mark.parametrize("text, tolerance", [
    (CLOSE, True),
    ("AssertionError: Scalars are not close!\n\nExpected 1.0 but got 1.1.", True),
    ("AssertionError: tensor(0.52) not less than or equal to 0.5", True),
    ("AssertionError: tensor(3.1) not less than tensor(2.9) : polar_express norm is larger", True),
    (CRASH, False),
    ("AssertionError: Regex pattern did not match.", False),
])
def test_what_counts_as_a_tolerance_failure(text, tolerance):
    assert peer_compare.is_tolerance(text) is tolerance
