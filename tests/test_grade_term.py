"""The grader through a real term (issue 46): a class folder with mixed, broken and stray files, a points file for one
chapter of several, grader failures that must never become grades, and a grader started without ``-P`` from a
folder holding a student's modules. One class run (two chapters' references: the fixture's chapter 1 and a copy of
it under another chapter's name) serves most tests; the rest call the functions they test."""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attention_course.course import cli

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "grader"
NAME = "01_soft_lookup_exercises.ipynb"
OTHER = "07_copy_exercises.ipynb"  # chapter 1's notebook under another chapter's name: a second reference
POINTS = "[notebooks.01_soft_lookup_exercises]\n1 = 4\n"  # names one chapter only, as the instructor guide's example


def _references(tmp: Path) -> Path:
    refs = tmp / "solutions"
    refs.mkdir(exist_ok=True)
    shutil.copy(DATA / "solutions" / NAME, refs / NAME)
    shutil.copy(DATA / "solutions" / NAME, refs / OTHER)
    return refs


def test_a_points_file_naming_one_chapter_is_valid_for_each_other_chapters_notebook(tmp_path):
    """The child process that grades one submission validates the course's points file against that submission's
    reference alone: another chapter named in the file is not an error there (it was one, and every notebook of
    every other chapter was an ERROR worth 0)."""
    refs = _references(tmp_path)
    (tmp_path / "points.toml").write_text(POINTS, encoding="utf-8")
    parser = argparse.ArgumentParser()
    for reference in (refs, refs / NAME, refs / OTHER):
        points = cli.load_points(parser, argparse.Namespace(points=str(tmp_path / "points.toml"), reference=reference))
        assert points.of(NAME, 1, "warm-up")[0] == 4 and points.of(OTHER, 1, "warm-up")[0] == 1
    (tmp_path / "typo.toml").write_text("[notebooks.01_soft_lookup]\n1 = 4\n", encoding="utf-8")
    with pytest.raises(SystemExit):  # against the whole folder a name that matches nothing is still refused
        cli.load_points(parser, argparse.Namespace(points=str(tmp_path / "typo.toml"), reference=refs))
