"""``python -m mugraph``: the command line.

Stages are imported lazily inside the commands that need them, so the IR never
depends on ``search``, ``verify`` or ``lower``.
"""

from __future__ import annotations

import sys

import click

from .errors import MugraphError


class _Group(click.Group):
    """Turns mugraph errors into one-line messages instead of tracebacks."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MugraphError as e:
            raise click.ClickException(f"{type(e).__name__}: {e}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """mugraph: a multi-level superoptimizer for tensor programs.

    \b
    Typical use:
      python -m mugraph demo                      run the six benchmarks' hand-written μGraphs
      python -m mugraph show graph.json --png g.png
      python -m mugraph verify ref.json cand.json prove a hand-written kernel equivalent
    """


@main.command()
@click.option("--batch", "-b", default=1, show_default=True, help="Benchmark batch size b (DESIGN §7).")
@click.option("--small", is_flag=True, help="Reduced shapes (fast).")
@click.option("--out", "out_dir", default="out/demo", show_default=True, help="Where to save JSON and pictures.")
@click.option("--seed", default=0, show_default=True)
def demo(batch: int, small: bool, out_dir: str, seed: int) -> None:
    """Evaluate each benchmark's hand-written μGraph against its program (float64)."""
    from .demo import format_rows, run_demo

    rows = run_demo(b=batch, small=small, out_dir=out_dir, seed=seed)
    click.echo(format_rows(rows))
    click.echo(f"saved programs, μGraphs and pictures under {out_dir}/")
    bad = [r.name for r in rows if not r.rel_error <= 1e-10]
    if bad:
        raise click.ClickException(f"μGraphs disagree with their programs: {bad}")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", default=None, help="Which graph, if the file defines several.")
@click.option("--png", "png", default=None, type=click.Path(dir_okay=False),
              help="Also draw it (suffix picks the format: .png .svg .pdf .dot).")
def show(file: str, name: str | None, png: str | None) -> None:
    """Print a program or μGraph (a saved .json, or a .py file that builds one)."""
    from .loading import graph_from_file
    from .render import render

    g = graph_from_file(file, name)
    click.echo(str(g))
    if png:
        click.echo(f"wrote {render(g, png)}")


@main.command()
@click.argument("ref", type=click.Path(exists=True, dir_okay=False))
@click.argument("cand", type=click.Path(exists=True, dir_okay=False))
@click.option("--error", default=2.0 ** -40, show_default=True, help="Target probability of a false accept.")
@click.option("--seed", default=None, type=int)
def verify(ref: str, cand: str, error: float, seed: int | None) -> None:
    """Prove CAND equivalent to REF by finite-field random testing (files: .json or .py)."""
    try:
        import verify as verify_stage
        run = verify_stage.verify_files
    except (ImportError, AttributeError):
        raise click.ClickException("the verify stage is not installed in this build") from None
    verdict = run(ref, cand, error=error, seed=seed)
    click.echo(str(verdict))
    if not verdict.equivalent:
        sys.exit(1)


if __name__ == "__main__":
    main()
