"""``python -m mugraph``: the command line (the product layer, beside
:mod:`mugraph.pipeline`: it may import the stages)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

import verify as verify_stage
from verify.standalone import failure_line

from .core.benchmarks import DECODE, PROGRAMS
from .demo import format_rows, run_demo
from .core.errors import MugraphError
from .core.loading import graph_from_file
from .pipeline import Interrupted, OptimizeConfig, superoptimize
from .pipeline.bench import COLUMNS, ROW_S, format_row, format_table, run_bench
from .core.render import render


class _Group(click.Group):
    """Every failure as one line on stderr — ``error: <what and why>`` — and a non-zero
    exit: 1 for a mugraph error (bad input, failed check), 2 for a usage error (a
    missing file, a number that is not one), 130 for Ctrl-C, 1 for anything unexpected
    (a bug: set ``MUGRAPH_TRACEBACK=1`` to see where). Never a traceback by default;
    a command's own ``sys.exit`` code passes through."""

    def main(self, *args, **kwargs):
        if kwargs.get("standalone_mode", True) is False:  # a caller handling errors itself
            return super().main(*args, **kwargs)
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            _fail("interrupted", 130)
        except click.UsageError as e:
            where = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
            _fail(f"{e.format_message()}{where}", e.exit_code)
        except click.ClickException as e:
            _fail(e.format_message(), e.exit_code)
        except MugraphError as e:
            _fail(f"{type(e).__name__}: {e}", 1)
        except Exception as e:  # noqa: BLE001 - a bug, still reported as one line
            if os.environ.get("MUGRAPH_TRACEBACK"):
                raise
            _fail(f"internal error, {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                  "(set MUGRAPH_TRACEBACK=1 for the traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {' | '.join(message.splitlines())}", err=True)
    sys.exit(code)


def _out_file(path: str | None, what: str) -> None:
    """Refuse an output path whose folder does not exist *before* the work that would
    write it (a search of minutes must not end in 'no such folder')."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise click.UsageError(f"{what} {path!r} is a folder; give a file name")
    if not p.parent.is_dir():
        raise click.UsageError(f"{what} {path!r}: folder {str(p.parent)!r} does not exist")


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
@click.option("--batch", "-b", default=1, show_default=True, type=click.IntRange(min=1),
              help="Benchmark batch size b (docs/design.md §8.5).")
@click.option("--small", is_flag=True, help="Reduced shapes (fast).")
@click.option("--out", "out_dir", default="out/demo", show_default=True, help="Where to save JSON and pictures.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
def demo(batch: int, small: bool, out_dir: str, seed: int) -> None:
    """Evaluate each benchmark's hand-written μGraph against its program (float64)."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise click.UsageError(f"--out {out_dir!r} is a file, not a folder")

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
    _out_file(png, "--png")
    g = graph_from_file(file, name)
    click.echo(str(g))
    if png:
        click.echo(f"wrote {render(g, png)}")


@main.command()
@click.argument("ref", type=click.Path(exists=True, dir_okay=False))
@click.argument("cand", type=click.Path(exists=True, dir_okay=False))
@click.option("--error", default=2.0 ** -40, show_default=True, type=float,
              help="Target probability of a false accept, in (0, 1).")
@click.option("--seed", default=None, type=int, help="Seed (an int >= 0) to replay a run; default: random.")
@click.option("--no-float", is_flag=True, help="Skip the float check (fp16/bf16/fp32 against float64).")
@click.option("--float-only", is_flag=True, help="Compare non-Lax graphs in floating point only (unproven).")
@click.option("--mirage-primes", is_flag=True,
              help="Fixed p=167, q=83 instead of a fresh random pair per test: Mirage's test, for comparison.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify(ref: str, cand: str, error: float, seed: int | None, no_float: bool, float_only: bool,
           mirage_primes: bool, as_json: bool) -> None:
    """Prove CAND equivalent to REF by finite-field random testing (files: .json or .py).

    Exit status 0 only when the graphs are equivalent and every check passed
    (field tests, error bound, float check); 1 when any check failed or the
    verdict is undecided (the failed checks are printed); 2 on bad input."""
    try:
        verdict = verify_stage.verify_files(ref, cand, error=error, seed=seed, float_check=not no_float,
                      field=verify_stage.MIRAGE if mirage_primes else verify_stage.DEFAULT,
                      non_lax="float" if float_only else "raise")
    except MugraphError as e:
        raise click.UsageError(f"{type(e).__name__}: {e}") from None
    click.echo(verdict.dumps(indent=1) if as_json else str(verdict))
    line = failure_line(verdict)
    if line:
        click.echo(line, err=True)
        sys.exit(1)


def _search_options(f):
    for opt in reversed([
        click.option("--time-limit", type=float, default=None,
                     help="Search time limit in seconds (default 300; the search ends earlier when its space "
                          "is exhausted)."),
        click.option("--max-block-ops", type=int, default=None, help="Most ops in one block graph."),
        click.option("--max-kernel-ops", type=int, default=None, help="Most ops in the kernel graph."),
        click.option("--workers", type=int, default=None, help="Search workers (default: the usable cores less one for the driver)."),
        click.option("--executor", type=click.Choice(["processes", "serial", "ray"]), default=None,
                     help="Where search tasks run (default processes; ray: pip install 'mugraph[ray]')."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--cache-dir", default=None, help="Result cache (default ~/.cache/mugraph)."),
        click.option("--no-cache", is_flag=True, help="Neither read nor write the cache."),
        click.option("--allow-unproven", is_flag=True,
                     help="Ship a searched μGraph whose verification passed its field tests without reaching the "
                          "target bound (evidence, not a proof), with a warning; by default only proven ones ship."),
    ]):
        f = opt(f)
    return f


def _config(time_limit, max_block_ops, max_kernel_ops, workers, executor=None, tune_s=None,
            allow_unproven: bool = False):
    s = {k: v for k, v in dict(time_limit=time_limit, max_block_ops=max_block_ops, max_kernel_ops=max_kernel_ops,
                                 workers=workers, executor=executor).items() if v is not None}
    return OptimizeConfig(search=s, tune_s=tune_s, allow_unproven=allow_unproven)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", default=None, help="Which program, if the file defines several.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--out", default=None, help="Save the result (JSON) here; reload it with mg.load.")
@click.option("--source", "show_source", is_flag=True, help="Print the generated Triton source.")
@click.option("--tune-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="On a GPU: seconds of tuning and timing the candidates, in all (default 240).")
@_search_options
def optimize(file, name, device, out, show_source, tune_seconds, time_limit, max_block_ops, max_kernel_ops, workers,
             executor, seed, cache_dir, no_cache, allow_unproven) -> None:
    """Superoptimize the Lax program FILE defines (.py that builds it, or a saved .json)."""
    _out_file(out, "--out")
    try:
        p = graph_from_file(file, name)
        opt = superoptimize(p, _config(time_limit, max_block_ops, max_kernel_ops, workers, executor, tune_seconds,
                                       allow_unproven),
                            device=device, cache_dir=False if no_cache else cache_dir, seed=seed)
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
@click.option("--name", "names", multiple=True, type=click.Choice(sorted(PROGRAMS) + sorted(DECODE)),
              help="Program(s) to run (default: the six benchmarks and the decode attention programs).")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(min=1), help="Batch sizes (default: 1 and 8).")
@click.option("--results", default="out/results", show_default=True,
              help="Saved results to time (NAME-bB.mug.json); missing ones are searched and saved here.")
@click.option("--out", "out", default=None,
              help="Folder for bench.csv (one line per row, written as each row finishes).")
@click.option("--timing", type=click.Choice(["graph", "cold", "warm"]), default="graph", show_default=True,
              help="graph: calls unrolled in one CUDA graph (triton do_bench_cudagraph, warm L2); cold: one graph "
                   "replay per call, L2 evicted before each; warm: one replay per call, back to back.")
@click.option("--top-k", default=None, type=click.IntRange(min=1),
              help="Results searched on a CPU: time exactly this many candidates (best predicted first) on the GPU "
                   "(default: those the cost model cannot tell apart, mugraph.pipeline.timing.plan_rerank); the "
                   "unfused program is always timed too.")
@click.option("--tune-seconds", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Per candidate: seconds of trying kernel configurations (default: sized by its configuration "
                   "space, within a total bound: plan_rerank).")
@click.option("--row-seconds", default=ROW_S, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="What one row may take in all: search, re-ranking, the reference's tuning and the baselines "
                   "(the tuning gets what the search leaves).")
@click.option("--gpus", default=None,
              help="Run rows side by side on several GPUs of this machine: 'all' or indices such as 0,1,2,3. Each "
                   "GPU gets its own share of the physical cores and runs its rows one after another (search "
                   "workers default to the share's size); the rows are merged into OUT/bench.csv.")
@_search_options
def bench(names, batches, results, out, timing, top_k, tune_seconds, row_seconds, gpus, time_limit, max_block_ops,
          max_kernel_ops, workers, executor, seed, cache_dir, no_cache, allow_unproven) -> None:
    """The benchmark table: ours vs the hand-written reference, PyTorch eager, torch.compile, SDPA and the
    memory floor; the search's wall time, verified count and reach (rows print as they finish)."""
    if gpus is not None:
        passthrough = _passthrough(results=results, timing=timing, top_k=top_k, tune_seconds=tune_seconds,
                                   row_seconds=row_seconds, time_limit=time_limit, max_block_ops=max_block_ops,
                                   max_kernel_ops=max_kernel_ops, executor=executor, seed=seed, cache_dir=cache_dir)
        if no_cache:
            passthrough.append("--no-cache")
        if allow_unproven:
            passthrough.append("--allow-unproven")
        _bench_on_gpus(gpus, list(names) or [*PROGRAMS, *DECODE], list(batches) or [1, 8], out or "out/bench",
                       workers, passthrough, row_timeout=2 * row_seconds + 600)
        return
    config = _config(time_limit, max_block_ops, max_kernel_ops, workers, executor, allow_unproven=allow_unproven)
    started = []

    def on_row(r):
        if not started:
            click.echo(COLUMNS)
            started.append(True)
        click.echo(format_row(r), nl=True)
        sys.stdout.flush()

    rows, head = run_bench(names or None, tuple(batches) or (1, 8), results, config, timing=timing, top_k=top_k,
                           tune_seconds=tune_seconds, on_row=on_row, seed=seed,
                           cache_dir=False if no_cache else cache_dir, out=out, row_seconds=row_seconds)
    click.echo("\n" + format_table(rows, head))


def _passthrough(**opts) -> list[str]:
    """Options given to ``bench``, as the command line of one row's process."""
    out = []
    for k, v in opts.items():
        if v is not None:
            out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def _bench_on_gpus(spec: str, names: list[str], batches: list[int], out: str, workers, passthrough,
                   row_timeout: float) -> None:
    """``bench --gpus``: the rows dealt to the GPUs (:mod:`mugraph.pipeline.parallel`); a row
    still running after ``row_timeout`` seconds (twice its budget and ten minutes for
    compiles) is killed and counted as failed."""
    import torch

    from .pipeline import parallel
    from .pipeline.bench import rows_from_csv

    gpus = parallel.parse_gpus(spec, torch.cuda.device_count())
    groups = parallel.core_groups(len(gpus))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise MugraphError(f"bench: --out {out!r} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(n, b) for n in names for b in batches]
    queues = parallel.assign(jobs, len(gpus))
    click.echo(f"{len(jobs)} rows on GPUs {gpus}, CPUs per GPU: {[len(g) for g in groups]}")
    codes = parallel.run_queues(
        queues, gpus, groups,
        lambda job, share, where: parallel.bench_argv(job[0], job[1], workers or share, where, passthrough),
        folder, echo=lambda line: click.echo(line), timeout=row_timeout)
    rows = parallel.merge_csv(folder, lambda r: (names.index(r["name"]), batches.index(int(r["b"]))))
    click.echo("\n" + format_table(rows_from_csv(rows), f"{len(rows)} of {len(jobs)} rows on GPUs {gpus}"))
    failed = sum(c != 0 for c in codes) + sum(len(q) for q in queues) - len(codes)
    if failed:
        raise MugraphError(f"bench --gpus: {failed} of {len(jobs)} rows failed or did not run "
                           f"(their output is above; merged rows in {folder / 'bench.csv'})")


if __name__ == "__main__":
    main()
