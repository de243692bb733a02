"""Every output option of pe-bench-report is checked before anything is written, and the
message names the option at fault (issue 37, item 5: ``--site <a file>`` blamed ``--out``,
after the report, tables and figures were written)."""

from __future__ import annotations

import os

import pytest

from pe_bench.errors import UserError
from pe_bench.report.inputs import check_output_folder
from pe_bench.report.site.pages import check_site_folder


@pytest.mark.parametrize("option", ["--out", "--latex", "--site"])
def test_a_file_is_refused_naming_the_option(tmp_path, option):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(UserError, match=rf"^{option} '.*a.txt' is a file; allowed: a folder"):
        check_output_folder(option, tmp_path / "a.txt")
    with pytest.raises(UserError, match=rf"^{option} .* cannot be made: .*a.txt is a file"):
        check_output_folder(option, tmp_path / "a.txt" / "inside")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_folder_is_refused(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(UserError, match=r"^--latex .* cannot be written to"):
        check_output_folder("--latex", tmp_path / "ro" / "tables")


def test_new_and_existing_folders_are_allowed_and_nothing_is_made(tmp_path):
    check_output_folder("--out", tmp_path)
    check_output_folder("--out", tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()


def test_a_site_folder_that_is_not_empty_and_holds_no_site_is_refused(tmp_path):
    check_site_folder(tmp_path / "site")  # new
    (tmp_path / "site").mkdir()
    check_site_folder(tmp_path / "site")  # empty
    (tmp_path / "site" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"^--site .* is not empty and holds no pe-bench site"):
        check_site_folder(tmp_path / "site")
