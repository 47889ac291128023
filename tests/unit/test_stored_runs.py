"""Studies stored run by run (benchmarks/studies/stored_runs.py): one runner at a time, settings
fixed per section, a changed arm config reruns that arm only."""

from __future__ import annotations

import pytest

from benchmarks.studies import stored_runs as sr


def test_a_second_runner_of_the_same_study_is_refused(tmp_path) -> None:
    path = tmp_path / "study.json.gz"
    with sr.exclusive(path):
        with pytest.raises(SystemExit, match="another runner"), sr.exclusive(path):
            pass
    with sr.exclusive(path):  # released when the first one ends
        pass


def test_sections_keep_settings_and_rerun_only_a_changed_arm() -> None:
    doc: dict = {"sections": {}}
    sec = sr.section(doc, "p", {"steps": 10}, {"a": ["x=1"], "b": []})
    sec["runs"] = {"a": {"1": {}}, "b": {"1": {}, "2": {}}}
    assert sr.todo(sec, {"a": ["x=1"], "b": []}, (1, 2)) == [("a", 2)]
    sec = sr.section(doc, "p", {"steps": 10}, {"a": ["x=2"], "b": []})
    assert "a" not in sec["runs"] and set(sec["runs"]["b"]) == {"1", "2"}
    with pytest.raises(SystemExit, match="was run with"):
        sr.section(doc, "p", {"steps": 20}, {"a": []})
    assert sr.slug("lagrangian, PI") == "lagrangian_PI"
