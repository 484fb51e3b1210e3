import runpy
from pathlib import Path


def test_readme_library_example_runs(capsys):
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "library_api.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "advantages:" in out and "SNR=" in out
