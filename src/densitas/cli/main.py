"""``densitas`` command line: ``densitas demo``, ``densitas bandwidth``, ``densitas info``."""

from __future__ import annotations

import typer

from densitas.cli import demo as demo_mod

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="densitas: fast big-table exploration on GPUs and multicore CPUs.")


@app.command()
def demo(
    size: int = typer.Option(10_000_000, "--size", min=1, help="Elements of generated data."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated data."),
) -> None:
    """Run every parallel primitive on generated data, check it against NumPy and time both."""
    ok = demo_mod.run(size=size, device=device, seed=seed)
    raise typer.Exit(code=0 if ok else 1)


@app.command("bandwidth")
def bandwidth_cmd(
    file: str = typer.Argument(..., help="A CSV or Parquet file, or a DuckDB database (.duckdb/.db)."),
    column: list[str] = typer.Option(..., "--column", "-c",  # noqa: B008
                                     help="Column(s); several give a bandwidth matrix."),
    method: str = typer.Option("plugin", "--method", "-m",
                               help="plugin, scott, silverman, lscv_h, lscv_H or isj."),
    engine: str = typer.Option("auto", "--engine", help="auto, exact or binned."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    table: str = typer.Option(None, "--table", help="Table of a DuckDB file (needed when it holds several)."),
    plot: str = typer.Option(None, "--plot", help="Write the density over a histogram to this PNG."),
) -> None:
    """Select a KDE bandwidth for column(s) of a file and print it with the time and device."""
    from densitas.cli import bandwidth as bw_mod
    from densitas.exceptions import DensitasError

    try:
        bw_mod.run(file, column, method, engine, device, table, plot)
    except (DensitasError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command()
def info() -> None:
    """Show the version, devices and which backend each operation uses."""
    demo_mod.info()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
