"""Output paths are checked before the work: one line, exit 2, instead of a traceback at the end."""

import pytest
from ppdist_testing import run_tool

from ppdist.errors import OutputPathError
from ppdist.utils.writable import check_output_dir, check_output_file


def test_output_folder_and_file_checks(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    check_output_dir(str(tmp_path / "new" / "deeper"), "--out")  # created later: fine
    check_output_file(str(tmp_path / "new" / "m.json"), "--output_json")
    with pytest.raises(OutputPathError, match=f"--out {a_file}: is a file, not a folder"):
        check_output_dir(str(a_file), "--out")
    with pytest.raises(OutputPathError, match=f"--out {a_file}/sub: cannot be created: {a_file} is a file"):
        check_output_dir(str(a_file / "sub"), "--out")
    with pytest.raises(OutputPathError, match=f"--output_json {tmp_path}: is a folder; give a file name"):
        check_output_file(str(tmp_path), "--output_json")
    with pytest.raises(OutputPathError, match="cannot be created: .* is a file, not a folder"):
        check_output_file(str(a_file / "curves.png"), "--out")
    assert OutputPathError.exit_code == 2


@pytest.mark.slow
def test_tools_refuse_an_output_they_cannot_write_before_the_work(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    result = run_tool(["plot_logs.py", str(tmp_path), "--out", str(tmp_path)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"ppdist: error: --out {tmp_path}: is a folder; give a file name"
    result = run_tool(["eval.py", "-c", "configs/rec/quickstart_synth.yml", "--output_dir", str(a_file)])
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == ""
    assert (
        result.stderr.strip()
        == f"ppdist: error: --output_dir {a_file}: is a file, not a folder; give a folder"
    )
