"""What ``python3 dev.py test`` runs: the timed fault tests under CI, with
``--faults`` or ``WATCHDOG_SLOW_TESTS=1``; a day's run outside CI leaves them out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    # The parallel run never holds a timed fault file; the timed run (two workers, whole
    # files each) holds them all, or is left out.
    assert all(file in runs[0] for file in timed) and runs[0].count("--ignore") == len(timed)
    assert runs[1:] == ([["-n", "2", "--dist", "loadfile", *timed, *dev.DURATIONS]] if faults else [])
    # Each whole run ends with its slowest tests (the time budgets).
    assert runs[0][-len(dev.DURATIONS) :] == dev.DURATIONS


def test_naming_test_paths_makes_one_run_as_given() -> None:
    assert dev.pytest_runs(["tests/unit"], False) == [[*dev.parallel([]), "tests/unit"]]
    assert dev.pytest_runs(["-n", "0", "-k", "cli"], True) == [["-n", "0", "-k", "cli"]]


def test_the_days_docs_build_reads_only_changed_pages_and_ci_reads_every_page(tmp_path: Path) -> None:
    assert dev.FRESH in dev.docs_command(tmp_path, fresh=True)
    assert dev.FRESH not in dev.docs_command(tmp_path, fresh=False)
    assert dev.FRESH in dev.docs_command(tmp_path), "`dev.py docs` reads every page"
    # A page newer than the last build that passed: every page is written, its links checked.
    assert dev.docs_outdated(tmp_path) and dev.WRITE_ALL in dev.docs_command(tmp_path, fresh=False)
    dev.docs_passed(tmp_path)
    assert not dev.docs_outdated(tmp_path) and dev.WRITE_ALL not in dev.docs_command(tmp_path, fresh=False)


def _sphinx(source: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sphinx", *dev.SPHINX_OPTIONS, *options, str(source), str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_days_docs_build_fails_on_an_unchanged_page_whose_link_a_change_broke(tmp_path: Path) -> None:
    """Only the changed page is read again, but every page is written again:
    a reference on an unchanged page to a label the change removed fails the
    incremental build, as it fails CI's fresh one."""
    source, out = tmp_path / "docs", tmp_path / "html"
    source.mkdir()
    (source / "conf.py").write_text("project = 'p'\n")
    (source / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   linking\n   target\n")
    (source / "linking.rst").write_text("Linking\n=======\n\nSee :ref:`there`.\n")
    (source / "target.rst").write_text("Target\n======\n\n.. _there:\n\nThere\n-----\n")
    assert _sphinx(source, out, dev.WRITE_ALL).returncode == 0
    (source / "target.rst").write_text("Target\n======\n\nThere\n-----\n")  # the label is gone
    assert _sphinx(source, out).returncode == 0, "writing only the pages read misses it (why every page is written)"
    broken = _sphinx(source, out, dev.WRITE_ALL)
    assert broken.returncode != 0 and "there" in broken.stderr and "linking.rst" in broken.stderr


def test_a_page_whose_warning_failed_the_docs_build_is_read_again_by_the_next_build(tmp_path: Path) -> None:
    """An incremental build counts a page as read even when its warning failed
    the build: without forgetting that build, the next one passes unchanged."""
    source, out = tmp_path / "docs", tmp_path / "html"
    source.mkdir()
    (source / "conf.py").write_text("project = 'p'\n")
    (source / "index.rst").write_text("Index\n=====\n\nSee :ref:`nowhere`.\n")
    first = _sphinx(source, out)
    assert first.returncode != 0 and "nowhere" in first.stderr
    assert _sphinx(source, out).returncode == 0, "Sphinx alone forgets the warning (why the build is forgotten)"
    dev.docs_passed(out)
    dev.forget_docs_build(out)
    assert not (out / ".doctrees").exists()
    assert not (out / dev.PASSED_STAMP).exists(), "a site that failed is not one the suite may read"
    again = _sphinx(source, out)
    assert again.returncode != 0 and "nowhere" in again.stderr


def test_the_release_check_beside_the_timed_faults_shows_its_output_after_them_and_keeps_its_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CI runs the release check beside the timed fault tests: its output
    is held until it ended, then shown whole, and its exit status is the
    run's to report (a failed release check fails CI)."""
    script = "import sys; print('built and installed'); sys.exit(3)"
    background = dev.BackgroundRelease.start([sys.executable, "-c", script])
    assert background.finish() == 3
    assert "built and installed" in capsys.readouterr().out
    assert not background.log.exists()
