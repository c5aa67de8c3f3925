"""Shared helpers of the decoder-layer examples (``torch_llama_layer.py``, ``hf_decoder_layers.py``).

Hugging Face decoder layers of five families built from hand-written configs (random
weights, nothing downloaded), a read-only KV cache, the inputs of one decode step as a
model passes them, timers (CUDA graphs on a GPU, a wall-clock median on the CPU), the
memory floor of a step, and a way to forget what the mugraph backend memoized in this
process (so a second compile reads its result cache from disk, as a fresh process would).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import inspect
import re
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path


class PastKV:
    """A read-only KV cache for one layer: ``update`` returns past + new (``torch.cat``) and
    writes nothing back, so every timed step sees the same past. ``calls`` counts updates
    (a layer that never called it did not attend over the cache)."""

    def __init__(self, k, v):
        self.k, self.v = k, v
        self.calls = 0

    def update(self, key_states, value_states, layer_idx=0, cache_kwargs=None, **_):  # (transformers >= 5.2x: kwargs=)
        import torch

        self.calls += 1
        return torch.cat([self.k, key_states], dim=2), torch.cat([self.v, value_states], dim=2)


class StaticKV:
    """A static KV cache, the layout transformers recommends under ``torch.compile``: key and
    value buffers of a fixed capacity; ``update`` writes the new rows at their positions
    (``index_copy_``, in place) and returns the whole buffers. The attention reads every
    slot and the mask hides those not yet written, so the shapes do not change from step to
    step (no recompilation, no search per cache length). Writing the same rows again leaves
    the buffers as they were: every timed step is the same step."""

    def __init__(self, k, v, positions):
        self.k, self.v, self.positions = k, v, positions
        self.calls = 0

    def update(self, key_states, value_states, layer_idx=0, cache_kwargs=None, **_):
        self.calls += 1
        self.k.index_copy_(2, self.positions, key_states)
        self.v.index_copy_(2, self.positions, value_states)
        return self.k, self.v


def static_capacity(kv: int, tokens: int, multiple: int = 256) -> int:
    """The static cache's capacity for ``kv`` past and ``tokens`` new positions: their sum
    rounded up to ``multiple`` slots (a cache sized for a longer generation reads more)."""
    return -(-(kv + tokens) // multiple) * multiple


def static_mask(tokens: int, kv: int, capacity: int, device, dtype):
    """The additive mask over a static cache: new token ``t`` (position ``kv + t``) sees the
    slots up to its own position; later slots, written or not, are hidden."""
    import torch

    j = torch.arange(capacity, device=device)[None]
    t = torch.arange(tokens, device=device)[:, None]
    mask = torch.zeros(tokens, capacity, device=device, dtype=dtype)
    return mask.masked_fill(j > kv + t, torch.finfo(dtype).min)[None, None]


def cache_keyword(layer) -> str:
    """The keyword under which ``layer.forward`` takes the KV cache: ``cache`` (transformers
    5.2x), ``past_key_values`` (4.56 on) or ``past_key_value`` (before). A cache passed under
    another name lands in ``**kwargs`` and is silently ignored."""
    params = inspect.signature(layer.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    return "past_key_values"


@dataclass
class Family:
    """One decoder layer: its public sizes, and the tiny ones of ``--small``."""

    name: str            # the column's label
    module: str          # transformers.models.<module>.modeling_<module>
    prefix: str          # <prefix>Config, <prefix>DecoderLayer, <prefix>RotaryEmbedding
    dims: dict           # public sizes
    small: dict          # tiny sizes (same structure: GQA ratio, explicit head_dim, ...)
    extra: dict = field(default_factory=dict)  # config fields of the family (both sizes)
    note: str = ""
    model: dict = field(default_factory=dict)  # the whole model's public sizes: layers, vocabulary


#: LLaMA-3-8B's and Mistral-7B's shared sizes, and the tiny grouped-query sizes of ``--small``
#: (two query heads per KV head) most families share
_8B_GQA = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336)
_TINY_GQA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)

FAMILIES = {
    "llama": Family("LLaMA-3-8B", "llama", "Llama", _8B_GQA, _TINY_GQA,
                    dict(rope_theta=500000.0, rms_norm_eps=1e-5),
                    model=dict(num_hidden_layers=32, vocab_size=128256)),
    "qwen2": Family("Qwen2-7B", "qwen2", "Qwen2",
                    dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944),
                    _TINY_GQA,
                    dict(rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False),
                    "biased q, k, v projections", dict(num_hidden_layers=28, vocab_size=152064)),
    "mistral": Family("Mistral-7B", "mistral", "Mistral", _8B_GQA, _TINY_GQA,
                      dict(rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None),
                      "v0.3 config: no sliding window", dict(num_hidden_layers=32, vocab_size=32768)),
    "phi3": Family("Phi-3-mini", "phi3", "Phi3",
                   dict(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192),
                   dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128),
                   dict(rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=None),
                   "fused qkv_proj and gate_up_proj; plain RoPE", dict(num_hidden_layers=32, vocab_size=32064)),
    "gemma": Family("Gemma-2B", "gemma", "Gemma",
                    dict(hidden_size=2048, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                         intermediate_size=16384),
                    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                         intermediate_size=128),
                    dict(rope_theta=10000.0, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh"),
                    "GeLU-tanh MLP, head_dim 256, one KV head",
                    dict(num_hidden_layers=18, vocab_size=256000, tie_word_embeddings=True)),
}

#: families beyond the five the tables are kept for: other attention and norm placements, run
#: by name (``--families qwen3``) to see the backend on layers it was not tuned on
MORE_FAMILIES = {
    "qwen3": Family("Qwen3-8B", "qwen3", "Qwen3",
                    dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         intermediate_size=12288),
                    dict(_TINY_GQA, head_dim=16),
                    dict(rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False),
                    "an RMSNorm of each query and key head before RoPE",
                    dict(num_hidden_layers=36, vocab_size=151936)),
    "olmo2": Family("OLMo-2-7B", "olmo2", "Olmo2",
                    dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008),
                    dict(_TINY_GQA, num_key_value_heads=4),
                    dict(rope_theta=500000.0, rms_norm_eps=1e-6),
                    "norms after attention and MLP; q and k normed over all heads",
                    dict(num_hidden_layers=32, vocab_size=100352)),
    "starcoder2": Family("StarCoder2-3B", "starcoder2", "Starcoder2",
                         dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=2,
                              intermediate_size=12288),
                         _TINY_GQA, dict(rope_theta=999999.4, norm_epsilon=1e-5, use_bias=True, sliding_window=None),
                         "LayerNorm; biased projections; GeLU-tanh MLP of two products",
                         dict(num_hidden_layers=30, vocab_size=49152)),
    "phi": Family("Phi-2", "phi", "Phi",
                  dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=32, intermediate_size=10240),
                  dict(_TINY_GQA, num_key_value_heads=4),
                  dict(rope_theta=10000.0, layer_norm_eps=1e-5, partial_rotary_factor=0.4),
                  "LayerNorm; attention and MLP in parallel; biased projections; RoPE on part of each head",
                  dict(num_hidden_layers=32, vocab_size=51200)),
}
#: the five the tables report, then the others
FIVE = list(FAMILIES)
FAMILIES = {**FAMILIES, **MORE_FAMILIES}


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def build_layer(family: str, small: bool, device: str, dtype, attn: str, max_positions: int, seed: int = 0):
    """``(config, layer, rotary embedding)`` of ``family`` at its public (or ``small``) sizes,
    random weights (linear weights N(0, 0.02)); raises (ImportError, AttributeError, ...)
    when this transformers lacks the family."""
    import torch
    import transformers

    fam = FAMILIES[family]
    mod = importlib.import_module(f"transformers.models.{fam.module}.modeling_{fam.module}")
    cfg_cls = getattr(transformers, f"{fam.prefix}Config")
    cfg = cfg_cls(**(fam.small if small else fam.dims), **fam.extra, num_hidden_layers=1, vocab_size=128,
                  max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    layer = getattr(mod, f"{fam.prefix}DecoderLayer")(cfg, layer_idx=0).to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.02)
    rope = getattr(mod, f"{fam.prefix}RotaryEmbedding")(cfg).to(device)
    return cfg, layer, rope


def model_mask(cfg, x, past_k, past_v, pos):
    """The attention mask the model would pass its layers for ``x`` (the new tokens) after a
    past of ``past_k``/``past_v``: transformers' own ``create_causal_mask`` on a dynamic cache
    holding that past. ``None`` where the model passes none (SDPA, one new token)."""
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask

    dc = DynamicCache()
    dc.update(past_k, past_v, 0)
    params = inspect.signature(create_causal_mask).parameters
    kw = dict(config=cfg, attention_mask=None, position_ids=pos)
    kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = x
    if "cache" in params:
        kw["cache"] = dc
    else:  # older transformers
        kw["past_key_values"] = dc
        kw["cache_position"] = pos[0]
    return create_causal_mask(**kw)


def additive_mask(tokens: int, kv: int, device, dtype):
    """A causal additive mask: the new tokens see the whole past and the new ones up to themselves."""
    import torch

    mask = torch.zeros(tokens, kv + tokens, device=device, dtype=dtype)
    mask[:, kv:] = torch.full((tokens, tokens), torch.finfo(dtype).min, device=device, dtype=dtype).triu(1)
    return mask[None, None]


def _step_draws(cfg, rope, tokens: int, kv: int, device, dtype):
    """``(x, past_k, past_v, positions, cos, sin)`` of one decode step: the new hidden
    states and the past keys and values drawn from a generator seeded with ``tokens`` (so
    every cache layout of a step sees the same values), the new tokens' positions
    ``kv .. kv+tokens-1`` and their rotary cos/sin."""
    import torch

    hd = head_dim(cfg)
    g = torch.Generator(device=device).manual_seed(tokens)
    x = torch.randn(1, tokens, cfg.hidden_size, generator=g, device=device, dtype=dtype)
    past_k = torch.randn(1, cfg.num_key_value_heads, kv, hd, generator=g, device=device, dtype=dtype)
    past_v = torch.randn(1, cfg.num_key_value_heads, kv, hd, generator=g, device=device, dtype=dtype)
    pos = torch.arange(kv, kv + tokens, device=device)
    cos, sin = rope(x, pos[None])
    return x, past_k, past_v, pos, cos, sin


def decode_inputs(cfg, rope, tokens: int, kv: int, device, dtype, mask: str = "model"):
    """``(args, how)``: the arguments of one decode step — new hidden states ``x``, the rotary
    ``cos``/``sin`` at positions ``kv .. kv+tokens-1``, the past keys and values and, unless
    the model passes none, the mask — and how the mask was made (``mask="model"``:
    transformers' ``create_causal_mask``, falling back to :func:`additive_mask`)."""
    x, past_k, past_v, pos, cos, sin = _step_draws(cfg, rope, tokens, kv, device, dtype)
    pos = pos[None]
    how = "additive causal mask"
    m = None
    if mask == "model":
        try:
            m = model_mask(cfg, x, past_k, past_v, pos)
            how = "transformers' create_causal_mask" + (" (none passed)" if m is None else f" ({m.dtype})")
        except Exception as e:  # noqa: BLE001 - another transformers: the hand-built mask
            how = f"additive causal mask (create_causal_mask failed: {type(e).__name__})"
            m = additive_mask(tokens, kv, device, dtype)
    else:
        m = additive_mask(tokens, kv, device, dtype)
    args = (x, cos, sin, past_k, past_v) + (() if m is None else (m,))
    return args, how


def static_inputs(cfg, rope, tokens: int, kv: int, device, dtype):
    """``(args, how)`` of one decode step over a :class:`StaticKV`: new hidden states ``x``,
    the rotary ``cos``/``sin`` at positions ``kv .. kv+tokens-1``, the key and value buffers
    (:func:`static_capacity` slots, the past in the first ``kv``), the positions written and
    the additive mask over the buffers (:func:`static_mask`)."""
    import torch

    x, past_k, past_v, pos, cos, sin = _step_draws(cfg, rope, tokens, kv, device, dtype)
    cap = static_capacity(kv, tokens)
    slots = (0, 0, 0, cap - kv)  # the past in the first kv slots, zeros after it
    k, v = torch.nn.functional.pad(past_k, slots), torch.nn.functional.pad(past_v, slots)
    args = (x, cos, sin, k, v, pos, static_mask(tokens, kv, cap, device, dtype))
    return args, f"additive mask over a static cache of {cap} slots"


def make_static_step(layer):
    """``step(x, cos, sin, k, v, positions, mask) -> hidden``: one decode step of ``layer``
    over a :class:`StaticKV` of the given buffers. ``step.last_cache`` is the last cache made."""
    key = cache_keyword(layer)

    def step(x, cos, sin, k, v, positions, mask):
        cache = StaticKV(k, v, positions)
        step.last_cache = cache
        r = layer(x, attention_mask=mask, position_embeddings=(cos, sin), use_cache=True, **{key: cache})
        return r[0] if isinstance(r, tuple) else r

    step.last_cache = None
    return step


def make_step(layer):
    """``step(x, cos, sin, past_k, past_v[, mask]) -> hidden``: one decode step of ``layer``
    over a :class:`PastKV` of the given past. ``step.last_cache`` is the last cache made."""
    key = cache_keyword(layer)

    def step(x, cos, sin, pk, pv, mask=None):
        cache = PastKV(pk, pv)
        step.last_cache = cache
        r = layer(x, attention_mask=mask, position_embeddings=(cos, sin), use_cache=True, **{key: cache})
        return r[0] if isinstance(r, tuple) else r

    step.last_cache = None
    return step


def wall_median(fn, seconds: float = 0.5, min_reps: int = 3, max_reps: int = 200) -> float:
    """Median wall-clock seconds of ``fn()`` (one warm-up call first); at least ``min_reps``
    calls, unless the warm-up alone took longer than ``seconds`` (then one)."""
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 > seconds:
        min_reps = 1
    ts = []
    t_end = time.perf_counter() + seconds
    while len(ts) < min_reps or (time.perf_counter() < t_end and len(ts) < max_reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def time_steps(launches: dict, device: str) -> dict:
    """Seconds per call of each launch (name -> no-argument callable), or the one-line error
    (a string) of the launch that could not be timed. GPU: medians over CUDA-graph replays,
    the launches timed in turns (``lower.profile.measure_together``); CPU: wall-clock medians."""
    if device == "cuda":
        from lower.profile import measure, measure_together

        try:
            return measure_together(launches, "graph", rounds=3)
        except Exception:  # noqa: BLE001 - one at a time, so one failure does not void the others
            out = {}
            for name, fn in launches.items():
                try:
                    out[name] = measure(fn, "graph")
                except Exception as e:  # noqa: BLE001
                    out[name] = one_line(e)
            return out
    out = {}
    for name, fn in launches.items():
        try:
            out[name] = wall_median(fn)
        except Exception as e:  # noqa: BLE001
            out[name] = one_line(e)
    return out


def kernel_profile(launches: dict, reps: int = 20, top: int = 40) -> dict:
    """Where each launch's time goes on the GPU, kernel by kernel: ``reps`` calls under
    ``torch.profiler`` (no CUDA graph, so launches are eager's), per launch the kernels'
    summed device time per call, their count per call and the ``top`` kernels by time.
    Beside a CUDA-graph replay's median, the sum says how much of a step is gaps between
    kernels rather than kernels; the list says which kernels a fusion would remove."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in launches.items():
        try:
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.count >= reps]
            kernels.sort(key=lambda e: -e.device_time_total)
            out[name] = {"kernel_us": sum(e.device_time_total for e in kernels) / reps,
                         "kernels": sum(e.count for e in kernels) / reps,
                         "top": [(e.key[:90], e.device_time_total / reps, e.count / reps) for e in kernels[:top]]}
        except Exception as e:  # noqa: BLE001 - a launch that cannot be profiled says why
            out[name] = {"error": one_line(e)}
    return out


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a large copy (read + write): ``mugraph.pipeline.bench.copy_bandwidth`` on a
    GPU; on the CPU a 256 MiB ``copy_``'s wall-clock median."""
    import torch

    if device == "cuda":
        from mugraph.pipeline.bench import copy_bandwidth as gpu_copy_bandwidth

        return gpu_copy_bandwidth()
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8)
    b = torch.empty_like(a)
    return 2 * n / wall_median(lambda: b.copy_(a), seconds=0.3)


def floor_bytes(cfg, layer, tokens: int, kv: int, dtype) -> dict:
    """Bytes a decode step must move at least: every weight once, the past keys and values
    once, and the activations (the hidden states in and out, the new keys and values)."""
    import torch

    es = torch.empty((), dtype=dtype).element_size()
    weights = sum(p.numel() * p.element_size() for p in layer.parameters())
    kv_bytes = 2 * kv * cfg.num_key_value_heads * head_dim(cfg) * es
    act = tokens * (2 * cfg.hidden_size + 2 * cfg.num_key_value_heads * head_dim(cfg)) * es
    return {"weights": weights, "kv": kv_bytes, "activations": act, "total": weights + kv_bytes + act}


def forget_backend_memo() -> None:
    """Forget the mugraph backend's per-process memo of searched, compiled and timed pieces,
    so the next compile finds its pieces as a fresh process would: in the result cache on
    disk (Triton's and Inductor's caches stay, as they do across processes)."""
    from mugraph.frontend import run

    run.forget()


def compile_phases(graphs) -> dict:
    """Where a compile's seconds went, summed over the backend's graphs (``recent_graphs()``
    entries): its captures' ``timings`` (capture, pieces, Inductor with and without the
    pieces, the whole-graph rule, total) and the searches' seconds."""
    out: dict = {}
    for c in graphs:
        for cap in c.captured.values():
            for k, v in cap.timings.items():
                out[k] = out.get(k, 0.0) + v
            searched, new = cap.search_seconds()
            out["searches_s"] = out.get("searches_s", 0.0) + searched
            out["new_searches"] = out.get("new_searches", 0) + new
    return out


def cuda_available() -> bool:
    """Whether torch sees a GPU (False where torch is missing)."""
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@dataclass
class Run:
    """What a model example's command line settles before its rows: the device (a GPU when
    one is there and ``--device`` allows), the dtype (bf16 on a GPU, float32 under Triton's
    interpreter), the output folder, the backend's result cache and the search time limit."""

    device: str
    dtype: object
    out: Path
    cache_root: Path
    time_limit: float


def start_run(args) -> Run:
    """Settle :class:`Run` from ``args`` (``device``, ``out``, ``cache``, ``time_limit``,
    ``verbose``): Triton's interpreter is switched on before torch is imported when there is
    no GPU to run on, the backend is registered and its log lines go to stderr (``-v``)."""
    import logging
    import os

    if args.device == "cpu" or (args.device == "auto" and not cuda_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    import mugraph.frontend  # noqa: F401 - registers the backend
    from mugraph.frontend.options import FrontendOptions

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mugraph").setLevel({0: logging.WARNING, 1: logging.INFO}.get(int(args.verbose), logging.DEBUG))
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return Run(device, torch.bfloat16 if device == "cuda" else torch.float32, out,
               Path(args.cache) if args.cache else out / "cache",
               args.time_limit if args.time_limit is not None else FrontendOptions().time_limit)


def source_commit() -> str | None:
    """The commit of the source tree these measurements ran, ``-dirty`` when its tracked
    files differ from it (the tables cite it); None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def fmt(v, spec: str) -> str:
    """``v`` formatted for a table cell, or "—" when it is not a number (not measured)."""
    return format(v, spec) if isinstance(v, (int, float)) else "—"


def table_head(columns: list[str]) -> list[str]:
    """A Markdown table's header line and separator line for ``columns``."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def row_notes(r: dict) -> str:
    """A table row's note: its errors, and what makes its compile times or results suspect."""
    notes = [r[k] for k in ("error", "mugraph_error", "warm_error", "eager_error", "compile_error") if k in r]
    if r.get("cold_cache_empty") is False:
        notes.append("cache not empty before: cold is not cold")
    if r.get("warm_matches_cold") is False:
        notes.append("warm result differs from cold")
    if r.get("graph_runs") in ("torch", "trace"):
        notes.append("the graph runs " + ("as traced, without its pieces" if r["graph_runs"] == "trace"
                                          else "as torch.compile compiles it"))
    return "; ".join(dict.fromkeys(notes))


def one_line(e: BaseException, n: int = 160) -> str:
    """``Type: first line`` of an error, at most ``n`` characters in all."""
    from mugraph.core.errors import first_line  # imported here: the package is heavy for a parent process

    return first_line(e, n)[:n]


def error_line(stderr: str) -> str:
    """The line of a child process's stderr that names its error: the last one that reads
    ``SomeError: …`` (torch ends its tracebacks with hints after it), else the last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Failed|Unmapped)\b.*:", ln)]
    return (named or lines or [""])[-1][:300]


class RowTimeout(Exception):
    pass


@contextlib.contextmanager
def hard_limit(seconds: float | None):
    """Raise :class:`RowTimeout` in this (main) thread after ``seconds`` (None: no limit).
    A little before that, every thread's stack goes to stderr (``faulthandler``'s watchdog,
    which needs no Python code to run): a row stuck inside a C call — a compile, a CUDA
    synchronize — never reaches the signal handler, and the dump says where it was."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return
    faulthandler.dump_traceback_later(max(1.0, 0.95 * seconds), exit=False)

    def fire(signum, frame):
        raise RowTimeout(f"stopped after {seconds:.0f} s (--row-timeout)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def profiled(path: Path | None, cumulative: int = 150, own: int = 40):
    """Run the block under cProfile and write its ``cumulative`` costliest calls (cumulative
    time) and ``own`` costliest (own time) to ``path``; nothing when ``path`` is None. Only
    this process's calls: a search's workers and a compile ahead are other processes."""
    if path is None:
        yield
        return
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(cumulative)
        stats.sort_stats("tottime").print_stats(own)
        Path(path).write_text(text.getvalue())
