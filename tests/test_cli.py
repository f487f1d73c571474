"""The command line, run in-process."""

from __future__ import annotations

from typer.testing import CliRunner

from densitas.cli.main import app


def test_demo_runs_and_checks_against_numpy():
    res = CliRunner().invoke(app, ["demo-primitives", "--size", "20000"])
    assert res.exit_code == 0, res.output
    assert "All results match NumPy." in res.output
    for name in ("reduce", "scan", "compact", "radix_sort", "histogram", "reduce_by_key", "summed_area_table"):
        assert name in res.output


def test_info_and_bad_device():
    res = CliRunner().invoke(app, ["info"])
    assert res.exit_code == 0 and "summed_area_table" in res.output
    res = CliRunner().invoke(app, ["demo-primitives", "--size", "10", "--device", "tpu"])
    assert res.exit_code != 0 and "device" in str(res.exception)
