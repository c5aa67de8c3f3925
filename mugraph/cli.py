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
      python -m mugraph optimize prog.py          superoptimize the program a Python file builds
      python -m mugraph bench --results out/res   the benchmark table (times on a GPU)
      python -m mugraph verify ref.json cand.py   prove a hand-written kernel equivalent
      python -m mugraph show graph.json --png g.png
      python -m mugraph demo                      hand-written μGraphs of the six benchmarks
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


def _search_options(f):
    for opt in reversed([
        click.option("--time-limit", type=float, default=None,
                     help="Search time limit in seconds (default 300; the search ends earlier when its space "
                          "is exhausted)."),
        click.option("--max-block-ops", type=int, default=None, help="Most ops in one block graph."),
        click.option("--max-kernel-ops", type=int, default=None, help="Most ops in the kernel graph."),
        click.option("--workers", type=int, default=None, help="Search workers (default 2)."),
        click.option("--executor", type=click.Choice(["processes", "serial", "ray"]), default=None,
                     help="Where search tasks run (default processes; ray: pip install 'mugraph[ray]')."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--cache-dir", default=None, help="Result cache (default ~/.cache/mugraph)."),
        click.option("--no-cache", is_flag=True, help="Neither read nor write the cache."),
    ]):
        f = opt(f)
    return f


def _config(time_limit, max_block_ops, max_kernel_ops, workers, executor=None):
    from .pipeline import OptimizeConfig

    s = {k: v for k, v in dict(time_limit=time_limit, max_block_ops=max_block_ops, max_kernel_ops=max_kernel_ops,
                                 workers=workers, executor=executor).items() if v is not None}
    return OptimizeConfig(search=s)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", default=None, help="Which program, if the file defines several.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--out", default=None, help="Save the result (JSON) here; reload it with mg.load.")
@click.option("--source", "show_source", is_flag=True, help="Print the generated Triton source.")
@_search_options
def optimize(file, name, device, out, show_source, time_limit, max_block_ops, max_kernel_ops, workers, executor,
             seed, cache_dir, no_cache) -> None:
    """Superoptimize the Lax program FILE defines (.py that builds it, or a saved .json)."""
    from .loading import graph_from_file
    from .pipeline import Interrupted, superoptimize

    try:
        p = graph_from_file(file, name)
        opt = superoptimize(p, _config(time_limit, max_block_ops, max_kernel_ops, workers, executor), device=device,
                            cache_dir=False if no_cache else cache_dir, seed=seed)
        click.echo(str(opt.graph))
        click.echo(opt.summary())
        if out:
            click.echo(f"saved {opt.save(out)}")
        if show_source and not opt.report.get("interrupted"):
            click.echo(opt.triton_source())
    except (KeyboardInterrupt, Interrupted) as e:
        _interrupted(str(e) if isinstance(e, Interrupted) else "interrupted")
    if opt.report.get("interrupted"):
        resume = f"; rerun to resume the search from {opt.report['checkpoint']}" if opt.report.get("checkpoint") else ""
        _interrupted(f"interrupted: the result above is the best μGraph verified so far (not cached{resume})")


def _interrupted(line: str) -> None:
    """Ctrl-C: one line on stderr and exit status 130 (128 + SIGINT), as shells report it."""
    click.echo(line, err=True)
    sys.exit(130)


@main.command()
@click.option("--name", "names", multiple=True, help="Benchmark(s) to run (default: all six).")
@click.option("--batch", "batches", multiple=True, type=int, help="Batch sizes (default: 1 and 8).")
@click.option("--results", default="out/results", show_default=True,
              help="Saved results to time (NAME-bB.mug.json); missing ones are searched and saved here.")
@click.option("--timing", type=click.Choice(["graph", "cold", "warm"]), default="graph", show_default=True,
              help="graph: calls unrolled in one CUDA graph (triton do_bench_cudagraph, warm L2); cold: one graph "
                   "replay per call, L2 evicted before each; warm: one replay per call, back to back.")
@click.option("--top-k", default=3, show_default=True,
              help="Results searched on a CPU: how many candidates (best predicted first) to autotune and time "
                   "on the GPU; the unfused program is always timed too.")
@click.option("--tune-seconds", default=None, type=float,
              help="Per candidate: stop trying new kernel configurations after this many seconds (default: all).")
@_search_options
def bench(names, batches, results, timing, top_k, tune_seconds, time_limit, max_block_ops, max_kernel_ops, workers,
          executor, seed, cache_dir, no_cache) -> None:
    """The benchmark table: ours vs PyTorch eager, torch.compile, SDPA and the memory floor."""
    from .pipeline.bench import COLUMNS, format_row, format_table, run_bench

    click.echo(COLUMNS)
    rows, head = run_bench(names or None, tuple(batches) or (1, 8), results,
                           _config(time_limit, max_block_ops, max_kernel_ops, workers, executor), timing=timing,
                           top_k=top_k, tune_seconds=tune_seconds, on_row=lambda r: click.echo(format_row(r)))
    click.echo("\n" + format_table(rows, head))


if __name__ == "__main__":
    main()
