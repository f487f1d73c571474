"""``densitas`` command line: ``densitas demo``, ``densitas info``."""

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


@app.command()
def info() -> None:
    """Show the version, devices and which backend each operation uses."""
    demo_mod.info()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
