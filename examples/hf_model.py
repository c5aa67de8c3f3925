"""Whole Hugging Face models under torch.compile(backend="mugraph"): the compile time of a
model and its decode step against eager, Inductor and the memory floor (docs/models.md,
"Measuring").

Where ``hf_decoder_layers.py`` times one decoder layer, this builds the whole causal LM of
each family (``examples/_layers.py``: LLaMA-3-8B 32 layers, Qwen2-7B 28, Mistral-7B 32,
Phi-3-mini 32, Gemma-2B 18, at their public vocabularies; random weights, nothing
downloaded), fills transformers' ``StaticCache`` with a prompt of ``--kv`` tokens (an eager
prefill), then compiles and times one decode step of ``--tokens`` new tokens — the
embedding, every layer, the final norm and the LM head, as ``generate`` runs them with
``cache_implementation="static"``.

What a whole model adds to a layer: its layers' pieces are the same pieces (structure and
shapes) with other weights, so the backend searches each distinct piece once and shares the
answer (``cold`` is the cost of a model, not of a layer times its depth); the graph is
``depth`` times longer for the partition, Inductor and the whole-graph never-slower rule;
and the LM head is a projection of its own (128k–256k columns).

The cache is rewound before each step (its write position set back to ``--kv``), so every
timed step writes the same slots and sees the same keys: the same step, replayed. Compile
times: cold (first call, an empty result-cache folder), warm (a fresh ``torch.compile``
after ``torch._dynamo.reset()`` and forgetting the backend's in-process memo: what a new
process pays with the cache on disk, less the kernels it loads). With ``--saved``, the step
is also compiled as a saved compile (``mugraph.frontend.saved_forward``: dynamo's trace kept
on disk with its guards), and new processes — the same model built again, its prompt
prefilled — time their first step: the saved compile loaded, a warm compile by the backend,
and a warm ``torch.compile`` (:func:`child`). Logits are compared with eager's (relative error, agreement of
each position's argmax).

    python examples/hf_model.py --families llama --out out/model                 # GPU, public sizes
    python examples/hf_model.py --small --layers 2 --device cpu --out /tmp/model --kv 16 --time-limit 5 --saved
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import _layers as L  # noqa: E402
from _layers import RowTimeout, hard_limit  # noqa: E402


def build_model(family: str, small: bool, layers: int | None, device: str, dtype, capacity: int, seed: int = 0):
    """``(config, model)``: ``family``'s causal LM at its public (or ``small``) sizes, all its
    layers (or ``layers``), random weights made on ``device`` in ``dtype`` directly (an 8B
    model never exists in float32 or on the CPU)."""
    import torch
    import transformers

    fam = L.FAMILIES[family]
    mod = importlib.import_module(f"transformers.models.{fam.module}.modeling_{fam.module}")
    sizes = {"num_hidden_layers": 2, "vocab_size": 128} if small else dict(fam.model)
    if layers:
        sizes["num_hidden_layers"] = layers
    cfg = getattr(transformers, f"{fam.prefix}Config")(
        **(fam.small if small else fam.dims), **fam.extra, **sizes, max_position_embeddings=capacity,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = getattr(mod, f"{fam.prefix}ForCausalLM")(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    return cfg, model


class Decode:
    """One decode step of ``model`` over a filled ``StaticCache``: ``step(fn)`` rewinds the
    cache's write position to the prompt's end and calls ``fn`` (the model's forward, eager
    or compiled) on the step's tokens; the logits come back."""

    def __init__(self, model, cfg, tokens: int, kv: int, capacity: int, device: str) -> None:
        import torch
        import transformers

        self.kv, self.model = kv, model
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.with_cache_position = "cache_position" in params
        self.cache = transformers.StaticCache(config=cfg, max_cache_len=capacity)
        g = torch.Generator(device=device).manual_seed(tokens)
        prompt = torch.randint(3, cfg.vocab_size, (1, kv), generator=g, device=device)
        self.ids = torch.randint(3, cfg.vocab_size, (1, tokens), generator=g, device=device)
        self.positions = torch.arange(kv, kv + tokens, device=device)[None]
        with torch.no_grad():
            model(**self._kwargs(prompt, torch.arange(kv, device=device)[None]))
        self.counters = [t for layer in getattr(self.cache, "layers", [])
                         for t in [getattr(layer, "cumulative_length", None)] if isinstance(t, torch.Tensor)]

    def _kwargs(self, ids, positions) -> dict:
        kw = {"input_ids": ids, "position_ids": positions, self.cache_kw: self.cache, "use_cache": True}
        if self.with_cache_position:
            kw["cache_position"] = positions[0]
        return kw

    def step(self, fn):
        """The logits of one step by ``fn``, its cache rewound first (transformers releases
        whose static cache counts the tokens written keep that count in a tensor per layer)."""
        for t in self.counters:
            t.fill_(self.kv)
        out = fn(**self._kwargs(self.ids, self.positions))
        return out.logits if hasattr(out, "logits") else out[0]


def floor_bytes(cfg, model, tokens: int, kv: int, dtype) -> int:
    """Bytes a decode step must move at least: every weight once — of an untied embedding only
    the ``tokens`` rows it looks up — and every layer's past keys and values once."""
    import torch

    es = torch.empty((), dtype=dtype).element_size()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        total -= (emb.shape[0] - tokens) * emb.shape[1] * emb.element_size()
    return total + 2 * cfg.num_hidden_layers * kv * cfg.num_key_value_heads * L.head_dim(cfg) * es


def run_row(row: dict, args, cfg, model, torch, device: str, dtype, bw: float, cache_root: Path,
            time_limit: float) -> None:
    from mugraph.frontend import recent_graphs

    T, kv = row["tokens"], row["kv"]
    cap = L.static_capacity(kv, T)
    d = Decode(model, cfg, T, kv, cap, device)
    want = d.step(model.forward).float()
    row["floor_us"] = floor_bytes(cfg, model, T, kv, dtype) / bw * 1e6

    rowdir = cache_root / row["family"] / f"t{T}-kv{kv}"
    row["cold_cache_empty"] = not (rowdir.exists() and any(rowdir.iterdir()))
    rowdir.mkdir(parents=True, exist_ok=True)
    opts = backend_options(args, rowdir, time_limit, device)

    L.forget_backend_memo()
    torch._dynamo.reset()
    before = {id(c) for c in recent_graphs()}
    cold_profile = Path(args.out) / f"{row['family']}-t{T}-kv{kv}-cold-profile.txt" if args.profile else None
    with L.profiled(cold_profile):
        t0 = time.perf_counter()
        cold = torch.compile(model.forward, backend="mugraph", options=opts)
        got = d.step(cold).float()
        row["cold_s"] = time.perf_counter() - t0
    graphs = [c for c in recent_graphs() if c.captured and id(c) not in before]
    pieces = [bp for c in graphs for cap_ in c.captured.values() for bp in cap_.pieces]
    row["graphs"] = len(graphs)
    row["pieces"] = len(pieces)
    row["distinct_pieces"] = len({bp.name for bp in pieces})
    row["pieces_mugraph"] = sum(bp.info.get("runs") == "mugraph" for bp in pieces)
    # each distinct piece once: what it runs and why, its search's share and seconds, and
    # where superoptimize's seconds went (``phases``)
    distinct = {bp.name: bp for bp in pieces}
    row["piece_info"] = [{"piece": bp.describe(), "instances": sum(p.name == n for p in pieces),
                          **{k: v for k, v in bp.info.items()
                             if isinstance(v, (bool, int, float, str, dict, type(None)))}}
                         for n, bp in distinct.items()]
    row["rel_err"] = float((got - want).norm() / want.norm())
    row["argmax_agrees"] = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    row["cold_phases"] = L.compile_phases(graphs)
    row["cold_dynamo_s"] = row["cold_s"] - row["cold_phases"].get("total_s", 0.0)
    del cold

    torch._dynamo.reset()
    L.forget_backend_memo()
    before = {id(c) for c in recent_graphs()}
    t0 = time.perf_counter()
    ours = torch.compile(model.forward, backend="mugraph", options=opts)
    again = d.step(ours).float()
    row["warm_s"] = time.perf_counter() - t0
    row["warm_phases"] = L.compile_phases([c for c in recent_graphs() if c.captured and id(c) not in before])
    row["warm_dynamo_s"] = row["warm_s"] - row["warm_phases"].get("total_s", 0.0)
    row["warm_matches_cold"] = bool(torch.allclose(again, got, rtol=1e-3, atol=1e-3 * got.abs().max().item()))

    t0 = time.perf_counter()
    default = torch.compile(model.forward)
    base = d.step(default).float()
    row["inductor_compile_s"] = time.perf_counter() - t0
    row["compile_rel_err"] = float((base - want).norm() / want.norm())  # Inductor's own distance from eager

    launches = {"eager": lambda: d.step(model.forward), "compile": lambda: d.step(default),
                "mugraph": lambda: d.step(ours)}
    for name, v in L.time_steps(launches, device).items():
        row[f"{name}_us" if isinstance(v, float) else f"{name}_error"] = v * 1e6 if isinstance(v, float) else v
    if args.kernels and device == "cuda":
        # kernel by kernel, where each step's time goes (written beside the table)
        row["kernels"] = L.kernel_profile({"compile": launches["compile"], "mugraph": launches["mugraph"]},
                                          reps=5, top=60)
    if isinstance(row.get("mugraph_us"), float):
        if isinstance(row.get("compile_us"), float):
            row["x_compile"] = row["compile_us"] / row["mugraph_us"]
        row["x_floor"] = row["mugraph_us"] / row["floor_us"]

    # torch.compile's own warm compile, for scale: a fresh compile after a reset, its FX graph
    # and autograd caches on disk (after the timings: the reset drops every compiled frame)
    torch._dynamo.reset()
    t0 = time.perf_counter()
    d.step(torch.compile(model.forward))
    row["inductor_warm_s"] = time.perf_counter() - t0
    if args.saved:
        saved_row(row, args, d, got, opts, rowdir / "saved", torch)


def backend_options(args, rowdir: Path, time_limit: float, device: str) -> dict:
    """The backend's options for one row (its result cache is the row's folder)."""
    opts = {"cache_dir": str(rowdir), "time_limit": time_limit, "inductor": device == "cuda",
            "kernel_op": args.kernel_op, "repeats_once": args.repeats_once}
    if args.graph_budget is not None:
        opts["graph_budget"] = args.graph_budget or None
    if args.inductor_config is not None:
        opts["inductor_config"] = args.inductor_config
    if args.workers:
        opts["search"] = {"workers": args.workers}
    if args.small:
        opts["search"] = {**opts.get("search", {}), "max_kernel_ops": 1, "max_block_ops": 4}
    return opts


def saved_row(row: dict, args, d: "Decode", got, opts: dict, folder: Path, torch) -> None:
    """The step as a saved compile, compiled here (dynamo's trace and the backend's warm
    compile, the pieces cached by the row's cold compile); then three new processes, each
    the model built again and its prompt prefilled, time their first step (:func:`child`):
    the saved compile loaded, a warm ``torch.compile(backend="mugraph")``, and
    ``torch.compile``'s own warm start — all three paying what a new process pays (kernels
    loaded from disk, a CUDA context), which a compile in this process does not."""
    from mugraph.frontend import saved_forward

    def first_step() -> tuple[float, dict]:
        """A fresh saved_forward's first step, after a reset and the backend's memo forgotten."""
        torch._dynamo.reset()
        L.forget_backend_memo()
        fn = saved_forward(d.model, folder, opts)
        t0 = time.perf_counter()
        d.step(fn)
        return time.perf_counter() - t0, next(iter(fn.info.values()), {})

    row["saved_compile_s"], _ = first_step()
    # loaded here, as the warm column compiles here
    row["saved_load_here_s"], info = first_step()
    row["saved_load_here_how"] = info.get("how")
    torch.save(got.cpu(), folder / "expected_logits.pt")
    for form in ("saved", "mugraph", "inductor"):
        row.update({f"{form}_{k}": v for k, v in run_child(form, row, args, folder).items()})


def run_child(form: str, row: dict, args, folder: Path) -> dict:
    """One new process of :func:`child`; its JSON line, or ``{"error": ...}``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", form, "--row-dir", str(folder),
           "--families", row["family"], "--tokens", str(row["tokens"]), "--kv", str(row["kv"]),
           "--out", str(args.out), "--device", args.device, "--kernel-op", args.kernel_op,
           "--cache", str(args.cache or Path(args.out) / "cache"), "-v"] + \
        ([] if args.repeats_once is None else ["--repeats-once" if args.repeats_once else "--no-repeats-once"])
    if args.inductor_config is not None:
        cmd += ["--inductor-config", json.dumps(args.inductor_config)]
    for flag, value in (("--layers", args.layers), ("--time-limit", args.time_limit),
                        ("--graph-budget", args.graph_budget), ("--workers", args.workers)):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += (["--small"] if args.small else []) + (["--profile"] if args.profile else [])
    log_path = Path(args.out) / f"{row['family']}-t{row['tokens']}-kv{row['kv']}-{form}.log"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "the new process ran past 600 s"}
    log_path.write_text(done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": L.error_line(done.stderr) or "no output"}
    return json.loads(lines[-1])


def child(args) -> int:
    """``--child FORM``: a new process's first decode step (the model built again, its prompt
    prefilled; neither counted), the step compiled as FORM says — ``saved``: the saved compile
    in ``--row-dir`` loaded (``mugraph.frontend.saved_forward``); ``mugraph``:
    ``torch.compile(backend="mugraph")``, warm from the row's caches; ``inductor``:
    ``torch.compile``'s own, warm from Inductor's caches. Prints one JSON line: the first
    step's seconds, the backend's phases, and the logits' relative distance from those of the
    compile that saved the step. ``--profile``: the first step under cProfile, its 150 costliest
    calls (cumulative) and 40 (own time) written beside the row's log (``_layers.profiled``)."""
    run = L.start_run(args)
    import torch

    from mugraph.frontend import recent_graphs, saved_forward

    fam, T, kv = args.families[0], args.tokens[0], args.kv[0]
    cap = L.static_capacity(kv, T)
    cfg, model = build_model(fam, args.small, args.layers, run.device, run.dtype, cap)
    folder = Path(args.row_dir)
    opts = backend_options(args, folder.parent, run.time_limit, run.device)
    with torch.no_grad():
        d = Decode(model, cfg, T, kv, cap, run.device)
        fn = {"saved": lambda: saved_forward(model, folder, opts),
              "mugraph": lambda: torch.compile(model.forward, backend="mugraph", options=opts),
              "inductor": lambda: torch.compile(model.forward)}[args.child]
        imported_before = set(sys.modules)
        with L.profiled(Path(args.out) / f"{fam}-t{T}-kv{kv}-{args.child}-profile.txt" if args.profile else None):
            t0 = time.perf_counter()
            compiled = fn()
            got = d.step(compiled).float()
            if run.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
    want = torch.load(folder / "expected_logits.pt").to(got.device)
    graphs = [c for c in recent_graphs() if c.captured]
    out = {"first_step_s": seconds, "phases": L.compile_phases(graphs) if graphs else None,
           "rel_err_vs_saved": float((got - want).norm() / want.norm()),
           **imports_since(imported_before)}
    if args.child == "saved":
        out["parts"] = next(iter(compiled.info.values()), None)
    print(json.dumps(out))
    return 0


def imports_since(before: set) -> dict:
    """How many modules the first step imported, and how many of them have no bytecode cache
    to read at the next start (Python compiled them from source and could not write one):
    what a new process pays that a compile in a warm process does not."""
    new = [m for name, m in list(sys.modules.items()) if name not in before]
    cached = [getattr(getattr(m, "__spec__", None), "cached", None) for m in new]
    return {"modules_imported": len(new),
            "modules_without_bytecode": sum(1 for c in cached if c and not os.path.exists(c))}


def format_table(rows: list[dict], header: dict) -> str:
    lines = [f"Whole models ({header['sizes']} sizes), one decode step on {header['device']}, {header['dtype']}, "
             f"SDPA attention, transformers' StaticCache; {header['timing']}. Memory floor at "
             f"{header['copy_bandwidth_GBps']:.0f} GB/s. Search ≤ {header['time_limit_s']:g} s a piece; cold = first "
             "call with an empty result cache, warm = a fresh compile with the same cache; saved: the step "
             "compiled to be saved, and loaded here (after a reset, as warm); new process: the first step of a "
             "warm torch.compile there (the model's build and prefill not counted).", "",
             *L.table_head(["model", "layers", "new tokens", "cached", "eager μs", "torch.compile μs", "mugraph μs",
                            "× compile", "floor μs", "mugraph / floor", "Inductor compile s (warm)", "cold s",
                            "warm s", "saved: compile s, load s (here)", "new process: saved load s", "new process: mugraph warm s", "new process: Inductor warm s", "pieces: μGraph / all (distinct)", "logits rel. err (Inductor's)",
                            "argmax agrees", "note"])]
    for r in rows:
        pieces = f"{r['pieces_mugraph']} / {r['pieces']} ({r['distinct_pieces']})" if "pieces" in r else "—"
        lines.append(
            f"| {r['model']} | {r.get('layers', '—')} | {r['tokens']} | {r['kv']} | {L.fmt(r.get('eager_us'), '.1f')} "
            f"| {L.fmt(r.get('compile_us'), '.1f')} | {L.fmt(r.get('mugraph_us'), '.1f')} | {L.fmt(r.get('x_compile'), '.2f')} "
            f"| {L.fmt(r.get('floor_us'), '.1f')} | {L.fmt(r.get('x_floor'), '.2f')} | {L.fmt(r.get('inductor_compile_s'), '.1f')} ({L.fmt(r.get('inductor_warm_s'), '.1f')}) "
            f"| {L.fmt(r.get('cold_s'), '.1f')} | {L.fmt(r.get('warm_s'), '.1f')} "
            f"| {L.fmt(r.get('saved_compile_s'), '.1f')}, {L.fmt(r.get('saved_load_here_s'), '.1f')} "
            f"| {L.fmt(r.get('saved_first_step_s'), '.1f')} "
            f"| {L.fmt(r.get('mugraph_first_step_s'), '.1f')} | {L.fmt(r.get('inductor_first_step_s'), '.1f')} | {pieces} | {L.fmt(r.get('rel_err'), '.1e')} ({L.fmt(r.get('compile_rel_err'), '.1e')}) "
            f"| {L.fmt(r.get('argmax_agrees'), '.2f')} | {row_note(r)} |")
    return "\n".join(lines)


def row_note(r: dict) -> str:
    """The row's notes, and where its new processes compiled modules from source (no bytecode
    to read): their first steps then include that compile, which an installed torch skips."""
    most = max((r.get(f"{form}_modules_without_bytecode") or 0 for form in ("saved", "mugraph", "inductor")),
               default=0)
    note = f"new processes compiled up to {most} modules from source (no bytecode)" if most else ""
    return "; ".join(n for n in (L.row_notes(r), note) if n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", choices=list(L.FAMILIES), default=["llama"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1], help="new tokens per decode step")
    ap.add_argument("--kv", type=int, nargs="+", default=[2048], help="prompt (cached) tokens")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's own)")
    ap.add_argument("--time-limit", type=float, default=None, help="search s a piece (default: the backend's)")
    ap.add_argument("--graph-budget", type=float, default=None, help="the backend's graph_budget (0: none)")
    ap.add_argument("--workers", type=int, default=None, help="search workers per piece (default: the backend's)")
    ap.add_argument("--kernel-op", choices=["auto", "triton_op", "custom_op"], default="auto",
                    help="how pieces become torch operators (the backend's kernel_op): a triton_op's kernels "
                         "are analysed by Inductor at every call site, a custom_op is opaque to it")
    ap.add_argument("--repeats-once", action=argparse.BooleanOptionalAction, default=None,
                    help="the backend's repeats_once: Inductor compiles the identical layers of the graph with "
                         "its pieces once (design §10.5); default: the backend's (on where its outputs are checked)")
    ap.add_argument("--inductor-config", type=json.loads, default=None, metavar="JSON",
                    help="the backend's inductor_config: Inductor settings for the graph with its pieces, "
                         "e.g. '{\"combo_kernels\": true}' (default: the backend's)")
    ap.add_argument("--cache", default=None, help="the backend's result cache (default: OUT/cache)")
    ap.add_argument("--out", required=True, help="folder for model.json and table.md")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--small", action="store_true", help="tiny configs, two layers (a CPU smoke run)")
    ap.add_argument("--row-timeout", type=float, default=1800.0, help="a row is stopped after this many s")
    ap.add_argument("--saved", action="store_true",
                    help="also compile each step as a saved compile and load it in a new process")
    ap.add_argument("--profile", action="store_true",
                    help="the cold compile under cProfile (it runs slower), and with --saved each new process's "
                         "first step; the costliest calls written beside the table")
    ap.add_argument("--kernels", action="store_true",
                    help="a GPU: each step's kernels under torch.profiler (time a call, count, the largest), "
                         "torch.compile's and mugraph's, in model.json")
    # the new processes of --saved
    ap.add_argument("--child", choices=["saved", "mugraph", "inductor"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--row-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="the backend's log lines; -vv also each configuration a tuning times")
    args = ap.parse_args()
    if args.child:
        return child(args)
    run = L.start_run(args)
    import torch
    import transformers

    device, dtype, out, cache_root, time_limit = run.device, run.dtype, run.out, run.cache_root, run.time_limit
    bw = L.copy_bandwidth(device)
    header = {"device": torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)",
              "dtype": str(dtype).replace("torch.", ""), "sizes": "tiny (--small)" if args.small else "public",
              "timing": ("medians over CUDA-graph replays" if device == "cuda" else
                         "wall-clock medians on the CPU (Triton's interpreter: nothing about a GPU)"),
              "copy_bandwidth_GBps": bw / 1e9, "time_limit_s": time_limit,
              "transformers": transformers.__version__, "torch": torch.__version__}
    print(f"# whole models on {header['device']}, {header['dtype']}, {header['sizes']} sizes; {header['timing']}")
    rows = []
    for fam in args.families:
        spec = L.FAMILIES[fam]
        base = {"family": fam, "model": spec.name}
        try:
            cap = max(L.static_capacity(k, t) for k in args.kv for t in args.tokens)
            cfg, model = build_model(fam, args.small, args.layers, device, dtype, cap)
            base["layers"] = cfg.num_hidden_layers
        except Exception as e:  # noqa: BLE001 - this transformers lacks the family, or memory
            rows += [{**base, "tokens": t, "kv": k, "error": f"build: {L.one_line(e)}"} for t in args.tokens
                     for k in args.kv]
            continue
        for T in args.tokens:
            for kv in args.kv:
                row = {**base, "tokens": T, "kv": kv}
                t0 = time.time()
                try:
                    with hard_limit(args.row_timeout), torch.no_grad():
                        run_row(row, args, cfg, model, torch, device, dtype, bw, cache_root, time_limit)
                except (RowTimeout, Exception) as e:  # noqa: BLE001 - a row that fails says why
                    row["error"] = L.one_line(e)
                finally:
                    torch._dynamo.reset()
                print(f"{spec.name} T={T} kv={kv}: " + json.dumps({k: v for k, v in row.items()
                                                                    if k not in base}, default=str)
                      + f" ({time.time() - t0:.0f} s)", flush=True)
                rows.append(row)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    table = format_table(rows, header)
    print("\n" + table)
    (out / "table.md").write_text(table + "\n")
    (out / "model.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
