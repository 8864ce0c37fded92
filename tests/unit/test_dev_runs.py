"""What ``python3 dev.py test`` runs: the timed fault tests under CI, with
``--faults`` or ``WATCHDOG_SLOW_TESTS=1``; a day's run outside CI leaves them out."""

from __future__ import annotations

import pytest

import dev


@pytest.mark.parametrize(
    ("ci", "slow", "argv", "faults"),
    [
        ("", "", [], False),
        ("true", "", [], True),
        ("", "", ["--faults"], True),
        ("", "1", [], True),
    ],
)
def test_the_timed_fault_tests_run_under_ci_or_when_asked(
    monkeypatch: pytest.MonkeyPatch, ci: str, slow: str, argv: list[str], faults: bool
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("WATCHDOG_SLOW_TESTS", slow)
    assert dev.with_faults(argv) is faults
    runs = dev.pytest_runs([], faults)
    timed = dev.timed_faults()
    assert timed and all(file not in dev.UNTIMED_FAULTS for file in timed)
    # The parallel run never holds a timed fault file; the serial run holds them all, or is left out.
    assert all(file in runs[0] for file in timed) and runs[0].count("--ignore") == len(timed)
    assert runs[1:] == ([["-p", "no:xdist", *timed]] if faults else [])


def test_naming_test_paths_makes_one_run_as_given() -> None:
    assert dev.pytest_runs(["tests/unit"], False) == [[*dev.parallel([]), "tests/unit"]]
    assert dev.pytest_runs(["-n", "0", "-k", "cli"], True) == [["-n", "0", "-k", "cli"]]
