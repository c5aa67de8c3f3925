"""Options of the front end and of the ``"mugraph"`` torch.compile backend."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.errors import ConfigError
from ..core.ir import short
from ..core.ops import folds


#: seconds of GPU tuning a piece's re-ranking gets per second of its search. The tuner's cost
#: model is made once per block and configuration (``lower.tiles.shared_analyses``), so a
#: second of tuning times 1.7× the configurations it timed before (H200, skinny projections:
#: 17–38 in 10 s against 10–22), and 0.6 s of it now times what a second did; the 40 % left
#: over goes to the compile's wall time, not to more tuning
TUNE_PER_SEARCH = 0.6

#: how a piece's configurations are tuned and its two forms timed (``lower.profile.TIMINGS``):
#: its weights and KV cache read from DRAM, as in the model's step, where the step's other
#: hundreds of megabytes pass through L2 between two reads of one weight. Timed warm, a
#: weight under the L2's size ranks configurations by L2 speed (Phi-3-mini's output
#: projection, 19 MB: 7.3 μs in tuning, 10.1 in the layer, H200)
PIECE_TIMING = "dram"

#: the least search time a piece gets when ``graph_budget`` is shared among many (seconds)
MIN_PIECE_S = 2.0

#: seconds a graph's compile spends outside its searches per ATen op of its capture: the
#: capture itself, Inductor's compile of the graph with its pieces and the whole-graph rule's
#: timing (H200, default options: a whole LLaMA-3-8B, 2,283–2,285 ops, 40.3 and 62.8 s; a
#: whole Phi-3-mini, 2,379–2,445 ops, 50.6 and 45.7 s; a decoder layer, 65-70 ops, 2.2–4.7 s).
#: What :meth:`FrontendOptions.search_budget` reserves from ``compile_budget`` before the
#: searches; Inductor's share varies by half between runs of one model, so the graph clock
#: corrects it once the compile ahead has measured Inductor on the graph (:class:`GraphClock`)
COMPILE_S_PER_OP = 0.021
#: seconds each distinct piece takes after its search: lowering its μGraph, registering the
#: operator, the never-slower rule's timing (the pieces' time less their searches': 16.3 s for
#: a whole LLaMA-3-8B's 13 distinct pieces, 9.8 s for a layer's 8; H200)
PIECE_AFTER_SEARCH_S = 1.3
#: seconds of Inductor's compile of a graph with its pieces per second the compile ahead took
#: (its child process, from its start to the end of its compile of the graph without them):
#: what the graph clock's ``end_hint`` predicts the rest of the compile from. The pieces add
#: to Inductor's work (each call of a piece's kernels is traced and analysed for what it
#: writes): a whole LLaMA-3-8B, 224 μGraph pieces, 56.2 s against the child's 39.0 (H200)
INDUCTOR_PER_AHEAD_S = 1.4
#: the same where the graph's identical layers are compiled once (``repeats_once``): Inductor
#: took 0.27× the child's seconds for a whole LLaMA-3-8B with its pieces (7.3 s against 27.0)
#: and 0.55× for a whole Phi-3-mini (11.1 against 20.1; H200)
INDUCTOR_PER_AHEAD_OUTLINED_S = 0.7
#: seconds the whole-graph rule takes after Inductor's compiles: the graph timed with its
#: pieces and without (H200, whole 3.8–8B models: 1.8–2.3 s)
GRAPH_RULE_TIMING_S = 2.5

#: default size limits of a piece (docs/design.md §10.3; measured in
#: examples/piece_search_size.py): larger pieces are cut before their search. 9 ops hold an
#: RMSNorm whose weight is a function of its own (Gemma's ``1 + w``) with the two
#: projections that read it, which a norm with a plain weight reaches at 8; such a piece
#: composes on two CPU workers in 13 s (2048 × 2048 and 2048 × 256 bf16 weights)
MAX_PIECE_OPS = 9
#: sizes a graph of dynamic shapes specializes under ``dynamic="auto"`` before the rest run
#: as Inductor compiles it (:class:`FrontendOptions`)
DYNAMIC_SIZES = 2
#: 3, of which more than 2 only where all project one activation (``partition.MAX_MIXED_MATMULS``):
#: an RMSNorm's q, k and v projections in one piece, which the search makes one pass over the
#: activations (a block saves as many tiles as its program has outputs); at 2 the v projection
#: was a piece and a kernel of its own (5.8 μs a LLaMA-3-8B layer against a ~2 μs floor, H200).
#: On the nine families' tiny layers that is all it changes: every MLP, attention and output
#: projection is cut as at 2
MAX_PIECE_MATMULS = 3

#: Inductor settings for the graph with its μGraph pieces (``inductor_config``).
#: ``combo_kernels``: Inductor launches independent small kernels of one region as one —
#: between a decode step's pieces it ran a layer's RoPE, KV-cache writes and cache counter as
#: small kernels of their own (8 a layer, 1.0–1.4 μs each). Measured (H200, whole
#: Phi-3-mini over 8k keys, the same pieces): 3586.2 → 3523.2 μs a step (1.12 → 1.14×
#: torch.compile). Only Triton's code generation reads it (a CPU compile is unchanged).
INDUCTOR_CONFIG: dict = {"combo_kernels": True}


def piece_weight(kinds: list[str]) -> int:
    """How much of a graph's budget a piece of these op kinds gets: 1 and one more for each
    op that folds a dim (a matmul, a reduction). Why: the search's space grows with the
    loops and accumulators a μGraph needs, one per folded dim — a decode attention (two
    matmuls, a max, a sum) found its first match after 6–10 s where a projection's came
    within 1 s (H200, 15 workers) — while element-wise ops fuse at no cost to the search.
    Equal shares left attention pieces of 8 new tokens unverified at 11 s while element-wise
    pieces used theirs in full."""
    return 1 + sum(folds(k) for k in kinds)


#: a piece that reads and writes fewer bytes than this (256 KB: under 0.1 μs at a GPU's copy
#: bandwidth) is bound by its kernel launches, not by memory: a μGraph can save it a launch
#: or two, about a microsecond, so its search gets the least share (:func:`search_weight`)
SMALL_PIECE_BYTES = 1 << 18


def search_weight(program) -> int:
    """:func:`piece_weight` of ``program``'s op kinds — or 0 when the search's space holds no
    μGraph of it but itself (``search.proposals.ungenerated_on_computed``: a ``reshape`` of a
    computed value — a q/k projection's head split before its RoPE, the output projection's
    head merge of a permuted input): such a piece gets the least share, :data:`MIN_PIECE_S`,
    and the rest of the graph's budget goes to pieces that can match (under the default
    ``unfused="torch"`` such a piece is not searched at all: ``run.unsearched``). Measured (H200, 15
    workers, default options): a LLaMA-3-8B 8-token step gave its two projection+RoPE pieces
    and its output projection 32 s of the 80 s of search, none of which ever matched, while
    its attention, whose first match comes at 12–30 s, had 20 s.

    A piece that moves fewer than :data:`SMALL_PIECE_BYTES` (inputs and outputs) weighs 0
    as well: what it can gain is bounded by its launches. Measured (H200, a whole
    LLaMA-3-8B, default options): its two RoPE pieces (a 32- and an 8-head slice of one
    token) had 9 s of search and 9 of tuning each for μGraphs of 1.6–1.8 μs against 1.1–1.2
    for torch's ops, while the attention had 22 s."""
    from lower.cost_model import memory_floor_bytes
    from search.proposals import ungenerated_on_computed

    if ungenerated_on_computed(program) or memory_floor_bytes(program) < SMALL_PIECE_BYTES:
        return 0
    return piece_weight([op.kind for op in program.ops])


def repeat_weights(weights: dict[Any, float], calls: dict[Any, int]) -> dict[Any, float]:
    """``weights`` (:func:`search_weight`, by distinct piece) scaled by how often the graph
    calls each piece against its most called one: ``weight × calls / most``. What a piece's
    search can win is paid back at every call of it, so in a model whose identical layers
    share their pieces, a piece met once (the first layer's, cut unlike the others; the LM
    head) gets a small share — at least :data:`MIN_PIECE_S`, through :func:`share_limits` —
    and the rest of the budget goes to the pieces every layer runs. A graph whose pieces are
    all called once (a decoder layer) keeps its shares. Measured (H200, default options,
    2026-12-02): the first layers of whole LLaMA-3-8B, Mistral-7B and Qwen2-7B models made
    two pieces that no other layer has, which took 12–20 s of search, checks and tuning and
    shipped nothing (one timed within 2 % of torch's ops, the other found no μGraph); Gemma-2B's
    and Phi-3-mini's single-call pieces took 10–19 s for 1–3 μs a step."""
    most = max(calls.values(), default=1)
    return {k: w * calls[k] / most for k, w in weights.items()}


def tune_seconds(time_limit: float) -> float:
    """Seconds of GPU tuning for a piece searched ``time_limit`` seconds:
    :data:`TUNE_PER_SEARCH` of it, and never below :data:`MIN_PIECE_S` (a compile and a
    timing of the program and of the predicted best candidate)."""
    return max(MIN_PIECE_S, time_limit * TUNE_PER_SEARCH)


def piece_seconds(time_limit: float) -> float:
    """Seconds a piece searched ``time_limit`` seconds asks for on a GPU: the search and the
    re-ranking's tuning (:func:`tune_seconds`)."""
    return time_limit + tune_seconds(time_limit)


def share_limits(weights: list[float], budget: float, cap: float) -> list[float]:
    """Search time limits for pieces of ``weights``: ``c · weight`` clamped to
    [:data:`MIN_PIECE_S`, ``cap``], with the largest ``c`` whose :func:`piece_seconds` add
    up to at most ``budget`` (found by bisection: the sum grows with ``c``). All at the least
    when even that is more than ``budget`` (the compile warns: :meth:`Captured.compile`)."""
    def limits(c: float) -> list[float]:
        return [min(cap, max(MIN_PIECE_S, c * w)) for w in weights]

    def spent(c: float) -> float:
        return sum(piece_seconds(t) for t in limits(c))

    weighed = [w for w in weights if w > 0]
    if not weighed or spent(0.0) >= budget:
        return limits(0.0)
    lo, hi = 0.0, max(cap, MIN_PIECE_S) / min(weighed)  # every weighed piece at cap
    if spent(hi) <= budget:
        return limits(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spent(mid) <= budget else (lo, mid)
    return limits(lo)


@dataclass
class FrontendOptions:
    """``torch.compile(m, backend="mugraph", options={...})`` takes these keys.

    ``time_limit``: seconds of search per piece (the search's ``time_limit``); on a GPU the
    re-ranking's tuning gets :data:`TUNE_PER_SEARCH` times as many (``OptimizeConfig.tune_s``),
    so a piece's search takes about 1.6 times this, not the 240 s of tuning a lone
    ``superoptimize`` may spend.
    ``graph_budget``: seconds of search and tuning for one compiled graph's pieces in all:
    each of its distinct pieces to search (one search per name) gets the smaller of
    ``time_limit`` and its share in proportion to its :func:`piece_weight` and to how often
    the graph calls it (:func:`repeat_weights`), at least
    :data:`MIN_PIECE_S`, all of them scaled so that their searches and tuning add up to
    ``graph_budget`` (:meth:`for_pieces`) — in a LLaMA decode step the attention (two
    matmuls, a max and a sum: weight 5 of 16, with two pieces at the least share) 23 s, a
    projection with its residual (weight 2) 9 s, at the default 128; a graph of two pieces
    the full 30 — so a
    model's cold compile is bounded whatever
    its size (identical layers share their pieces). A hard bound: a piece's checks and tuning
    stop before they eat into the later pieces' time (:class:`GraphClock`). ``None``:
    ``time_limit`` for every piece, each with its own slack.
    ``compile_budget``: seconds the backend's compile of one graph aims to take — capture,
    searches, the pieces' lowering and timing, Inductor. The searches get ``graph_budget``,
    cut to what the rest of the compile leaves (:meth:`search_budget`: predicted from the
    graph's ATen ops and distinct pieces, so a warm compile asks the result cache for the
    same shares): a decoder layer's searches keep their 128 s, a whole 7–8B model's get about
    100. The default 160 s leaves dynamo's own trace of a whole model (4–8 s) and the overrun
    measured past the budget (up to 8 s: a verification or a kernel compile that cannot stop
    midway, Inductor's time varying by a third) within the 180 s a cold compile of one is
    meant to take (whole LLaMA-3-8B and Phi-3-mini on an H200 at 170 s: 163–184 s).
    ``None``: ``graph_budget`` as given — and so it is when the options name a
    ``graph_budget`` but no ``compile_budget``.
    ``min_ops``: a piece with fewer compute ops (catalog ops other than reshapes,
    permutes and casts) is left to torch — a lone matmul or element-wise op is not
    worth a search.
    ``max_piece_ops``, ``max_piece_matmuls``: a piece with more catalog ops or matmuls
    is cut on its cheapest edges into parts within both (``None``: no limit; §10.3); the
    element-wise ops computing a function of one value (an activation written out) count
    as one op, and more than two matmuls share a piece only as projections of one
    activation (q, k and v).
    ``cache_dir``: where searched pieces are cached (``None``: mugraph's default,
    ``$MUGRAPH_CACHE_DIR`` or ``~/.cache/mugraph``; ``False``: no cache).
    ``search``: further ``search.SearchConfig`` fields (``workers``, ``executor``, …).
    ``inductor``: compile the stitched graph with Inductor (else run it eagerly).
    ``inductor_config``: Inductor settings (``torch._inductor.config`` names, dotted for
    its sub-configs, and their values) for the compile of the graph with its μGraph pieces;
    the graph without them — the whole-graph rule's other side — is compiled as
    ``torch.compile`` compiles it. Default :data:`INDUCTOR_CONFIG`.
    ``kernel_op``: ``"auto"``, ``"triton_op"`` or ``"custom_op"`` (see
    :mod:`mugraph.frontend.kernels`). ``"auto"`` is a ``triton_op`` on a GPU: Inductor
    launches its kernels from its own wrapper. A ``custom_op`` is opaque to Inductor and
    compiles in about half the time, but each call runs the piece's Python body: the same
    step under CUDA graphs, 2.1× torch.compile's without them (an 8-layer LLaMA-3-8B on an
    H200, results.md "Compile time").
    ``seed``: the search's and verifier's seed.
    ``deadline``: a wall-clock time (``time.time()``) after which no new search
    starts (pieces not in the cache then stay torch code, one log line each);
    bounds a whole model's compile.
    ``unfused``: what a piece runs when its search found nothing better than the
    program itself, op by op — ``"torch"`` (default) leaves it to torch and
    Inductor, whose library kernels beat one generated kernel per op (measured on
    the H100 at LLaMA-3-8B sizes: 3–10× slower op by op); ``"lower"`` lowers the
    program anyway (still judged by ``never_slower`` where pieces are timed).
    ``allow_unproven``: let a piece run a searched μGraph whose verification passed its
    field tests without reaching the target bound (``OptimizeConfig.allow_unproven``; a
    warning line each). Off by default: a piece runs only proven μGraphs.
    ``never_slower``: a piece runs its μGraph only if it is faster than the piece's own torch
    ops, timed side by side when the piece is compiled (the never-slower rule, docs/models.md);
    otherwise it stays torch code, and ``bp.info`` records both times and why. The whole graph
    then runs with its μGraph pieces only if that is faster than without them
    (``Captured.whole``). On by default; ``False`` runs every μGraph the search returns, untimed.
    ``compile_ahead``: on a GPU, when the graph has new searches to run, Inductor compiles
    the graph without its pieces — the whole-graph rule's other side — in a child process
    while they run (:mod:`mugraph.frontend.ahead`), and the compile after them comes from
    Inductor's caches. On by default; ``False`` compiles it after the searches, here.
    ``timer``: how the rule times a piece's two forms — ``timer(piece, launches) ->
    {"mugraph": seconds, "torch": seconds}``, where ``piece`` is the
    :class:`~mugraph.frontend.pieces.BuiltPiece` (the :class:`~mugraph.frontend.graph.Captured`
    graph for the whole-graph comparison) and ``launches`` maps each form to a
    no-argument callable running it once on example inputs at the piece's shapes, strides,
    dtypes and device (on a GPU, each call on its own copy of the large inputs, as
    :data:`PIECE_TIMING` says: ``lower.cold_inputs``). ``None`` (default): on a GPU, CUDA-graph
    medians timed side by side (``lower.profile.measure_together``); on the CPU nothing is timed (the Triton interpreter
    says nothing of a GPU's speed) and every μGraph runs. A timer given here is used on any
    device — to time with other settings, or to decide on a CPU.
    ``dynamic``: what a graph with dynamic shapes runs — one dynamo traced with a symbolic
    dim after meeting it at two sizes (a batch of another size; a KV cache that grows by a
    token each step). ``"specialize"``: each size met is traced, searched, tuned and
    compiled as a static graph of its own — pieces whose shapes change with the dim (the
    attention over the cache) are searched again at each size, and every size pays an
    Inductor compile, seconds to a minute for a whole model; ``"inductor"``: the graph as
    Inductor compiles it, once for every size, without μGraph pieces — what
    ``torch.compile`` runs; ``"auto"`` (default): the first :data:`DYNAMIC_SIZES` sizes
    specialized, every later one the Inductor compile (one log line says so and why) — a
    few sizes (a batch of 1 and of 8) get their pieces, and a growing cache stops paying a
    search and a compile at every token. A static shape (transformers'
    ``cache_implementation="static"``; ``torch.compile(..., dynamic=False)``) is a graph of
    its own, searched once.
    ``repeats_once``: Inductor compiles a run of identical layers of the graph with its μGraph
    pieces once, as calls of one shared subgraph (:mod:`mugraph.frontend.repeats`), not once per
    layer (the graph without pieces, dynamo's, is compiled as it is either way). A mutating call
    cannot go into such a subgraph, so with it on a piece whose split-K kernels keep counters
    holds them itself instead of in a buffer of the graph. ``None`` (the default): on where
    the whole-graph rule checks the outlined form's outputs against torch.compile's (with
    Inductor and ``never_slower``, on a GPU or with a ``timer``; :meth:`outlines`), off
    elsewhere; ``True``/``False`` force it. On an H200 it cut Inductor's compile of a whole
    LLaMA-3-8B with its pieces from 32–75 s to 7 s at the same step time (design §10.5).
    """

    time_limit: float = 30.0
    graph_budget: float | None = 128.0
    compile_budget: float | None = 160.0
    min_ops: int = 2
    max_piece_ops: int | None = MAX_PIECE_OPS
    max_piece_matmuls: int | None = MAX_PIECE_MATMULS
    cache_dir: Any = None
    search: dict = field(default_factory=dict)
    inductor: bool = True
    inductor_config: dict = field(default_factory=lambda: dict(INDUCTOR_CONFIG))
    kernel_op: str = "auto"
    seed: int = 0
    deadline: float | None = None
    unfused: str = "torch"
    allow_unproven: bool = False
    never_slower: bool = True
    compile_ahead: bool = True
    timer: Callable[..., dict] | None = None
    dynamic: str = "auto"
    repeats_once: bool | None = None

    def __post_init__(self) -> None:
        t = self.time_limit
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e6:
            raise ConfigError(f"time_limit={short(t)}: seconds of search per piece, > 0")
        g = self.graph_budget
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g < 1e7):
            raise ConfigError(f"graph_budget={short(g)}: seconds of search and tuning for a graph's pieces, "
                              "> 0, or None (time_limit for every piece)")
        c = self.compile_budget
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1e7):
            raise ConfigError(f"compile_budget={short(c)}: seconds a graph's compile aims to take, > 0, or None "
                              "(graph_budget as given)")
        if type(self.min_ops) is not int or self.min_ops < 0:
            raise ConfigError(f"min_ops={short(self.min_ops)}: must be an int >= 0 (0: search every piece)")
        for name in ("max_piece_ops", "max_piece_matmuls"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or v < 1):
                raise ConfigError(f"{name}={short(v)}: must be an int >= 1, or None (no limit)")
        if not isinstance(self.search, dict) or "time_limit" in self.search:
            raise ConfigError(f"search={short(self.search)}: a dict of search fields (time_limit is set by "
                              "the option time_limit)")
        for name in ("inductor", "allow_unproven", "never_slower", "compile_ahead"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={short(getattr(self, name))}: must be True or False")
        self._check_inductor_config()
        if self.repeats_once is not None and not isinstance(self.repeats_once, bool):
            raise ConfigError(f"repeats_once={short(self.repeats_once)}: must be True, False or None "
                              "(on where the whole-graph rule checks it)")
        if self.kernel_op not in ("auto", "triton_op", "custom_op"):
            raise ConfigError(f"kernel_op={short(self.kernel_op)}: use 'auto', 'triton_op' or 'custom_op'")
        if self.unfused not in ("torch", "lower"):
            raise ConfigError(f"unfused={short(self.unfused)}: use 'torch' or 'lower'")
        if self.dynamic not in ("auto", "inductor", "specialize"):
            raise ConfigError(f"dynamic={short(self.dynamic)}: use 'auto', 'inductor' or 'specialize'")
        if self.timer is not None and not callable(self.timer):
            raise ConfigError(f"timer={short(self.timer)}: a callable timer(piece, launches) -> "
                              "{'mugraph': s, 'torch': s}, or None")
        d = self.deadline
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float))):
            raise ConfigError(f"deadline={short(d)}: a time.time() value or None")
        if type(self.seed) is not int or self.seed < 0:
            raise ConfigError(f"seed={short(self.seed)}: must be an int >= 0")

    def _check_inductor_config(self) -> None:
        c = self.inductor_config
        if not isinstance(c, dict) or not all(isinstance(k, str) for k in c):
            raise ConfigError(f"inductor_config={short(c)}: a dict of torch._inductor.config names and values")
        if not c:
            return
        from torch._inductor import config as inductor_config

        known = inductor_config.get_config_copy()
        for k in c:
            if k not in known:
                close = difflib.get_close_matches(k, list(known), n=1)
                raise ConfigError(f"inductor_config: torch._inductor.config has no setting {short(k, 60)}"
                                  + (f"; did you mean {close[0]!r}?" if close else ""))

    @classmethod
    def of(cls, options: Any) -> "FrontendOptions":
        if isinstance(options, cls):
            return options
        if options is None:
            return cls()
        if not isinstance(options, dict):
            raise ConfigError(f"options={short(options)}: must be a dict of {[f.name for f in dataclasses.fields(cls)]}")
        names = [f.name for f in dataclasses.fields(cls)]
        for k in options:
            if k not in names:
                close = difflib.get_close_matches(str(k), names, n=1)
                raise ConfigError(f"mugraph backend: unknown option {short(k, 40)}"
                                  + (f"; did you mean {close[0]!r}?" if close else "") + f" (options: {', '.join(names)})")
        if "graph_budget" in options and "compile_budget" not in options:
            # a graph_budget the caller chose is theirs: compile_budget cuts only the default one
            options = {**options, "compile_budget": None}
        return cls(**options)

    def search_budget(self, aten_ops: int, distinct_pieces: int) -> float | None:
        """Seconds of search and tuning for a graph of ``aten_ops`` captured ATen ops and
        ``distinct_pieces`` pieces to search: ``graph_budget``, cut to what ``compile_budget``
        leaves after the rest of the compile — :data:`COMPILE_S_PER_OP` a op (capture,
        Inductor) and :data:`PIECE_AFTER_SEARCH_S` a piece — and never below
        :data:`MIN_PIECE_S`. ``None`` without a ``graph_budget``. It depends only on the graph,
        so a warm compile's shares are the cold one's (:meth:`for_pieces`)."""
        if self.graph_budget is None:
            return None
        if self.compile_budget is None:
            return self.graph_budget
        rest = aten_ops * COMPILE_S_PER_OP + distinct_pieces * PIECE_AFTER_SEARCH_S
        return max(MIN_PIECE_S, min(self.graph_budget, self.compile_budget - rest))

    def for_pieces(self, weights: dict[Any, float], budget: float | None = None) -> dict[Any, "FrontendOptions"]:
        """These options for each distinct piece to be searched, by its weight in ``weights``
        (:func:`search_weight`): ``time_limit`` cut to the piece's share of ``budget``
        (default ``graph_budget``; the graph's :meth:`search_budget`), the rest as is.

        The shares are in proportion to the weights, each at least :data:`MIN_PIECE_S` and
        at most ``time_limit``, and scaled so that the pieces' searches and tuning
        (:func:`piece_seconds`) add up to ``budget``: the least shares are paid out of it
        first. Why: a whole LLaMA-3-8B's five RoPE and norm pieces weigh nothing and each
        took the least share on top of the others', 20 s past a 112 s budget (H200, default
        options). A share depends only on the graph, so a warm compile asks the result
        cache for the same keys the cold one stored."""
        budget = self.graph_budget if budget is None else budget
        if budget is None or not weights:
            return dict.fromkeys(weights, self)
        limits = share_limits(list(weights.values()), budget, self.time_limit)
        return {k: self if t >= self.time_limit else dataclasses.replace(self, time_limit=t)
                for k, t in zip(weights, limits)}

    def tune_s(self) -> float:
        """Seconds of GPU tuning for a piece searched ``time_limit`` seconds (:func:`tune_seconds`)."""
        return tune_seconds(self.time_limit)

    def optimize_config(self) -> dict:
        # with unfused="torch" torch's ops run wherever the program would be the answer, and
        # the never-slower rule times them: the program needs no float check, tuning or timing
        return {"search": {**self.search, "time_limit": float(self.time_limit)},
                "tune_s": float(self.tune_s()), "timing": PIECE_TIMING,
                "allow_unproven": self.allow_unproven, "time_program": self.unfused != "torch"}

    def outlines(self, device: str) -> bool:
        """Whether Inductor compiles the graph's identical layers once on ``device``
        (``repeats_once``; None: where the whole-graph rule runs the outlined form against
        torch.compile's before it ships — a GPU, or any device with a ``timer`` — with
        ``never_slower`` on)."""
        if not self.inductor:
            return False
        if self.repeats_once is not None:
            return self.repeats_once
        return self.never_slower and (device == "cuda" or self.timer is not None)

    def key(self) -> str:
        """What decides a piece's result (not where it is cached, not how it is run)."""
        doc = {"search": self.optimize_config(), "seed": self.seed}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


class GraphClock:
    """The wall clock of one graph's searches: when each of its distinct pieces must be done
    (``superoptimize``'s ``stop_by``) for the graph's searches and tuning to end within
    ``graph_budget`` of the first one's start, and each piece's work after its search (its
    lowering, its operator, the never-slower rule's timing: ``after_s`` a distinct piece,
    :data:`PIECE_AFTER_SEARCH_S`, which :meth:`FrontendOptions.search_budget` reserves) after
    that.

    Each piece's limits (its share: :meth:`FrontendOptions.for_pieces`) stay what they are —
    they are its result's cache key, so a warm compile finds what the cold one stored — but
    a piece may no longer run past them into the time of the pieces after it: its stop is the
    graph's end less the nominal seconds (search and tuning) of the new searches still to
    come and the work after each piece from it on, and never before its own search's limit
    (``superoptimize`` guarantees that). What a piece leaves unused passes to the later ones.
    Why: each call's own slack (up to half its limits) added up — measured on a whole
    LLaMA-3-8B (H200, default options), searches and tuning took 195 s of a 160 s budget.

    ``end_hint`` (called at each piece's start): a ``time.time()`` by which the pieces must
    be done that was learnt during the searches — the compile ahead's measure of Inductor on
    this graph (``backend``). It moves the end earlier, never later. Why: the rest of a
    compile is predicted per ATen op before the searches start, and Inductor's share of it
    varies by half (a whole LLaMA-3-8B, H200: 34.8 and 56.5 s)."""

    def __init__(self, budget_s: float | None, nominal_s: list[float], after_s: float = 0.0,
                 end_hint: Callable[[], float | None] | None = None) -> None:
        #: seconds each distinct piece's first call asks for by its limits (0: cached, or done)
        self.nominal_s = nominal_s
        self.after_s = after_s
        self.end_hint = end_hint
        self.t0 = time.time()
        #: when the last piece's work must be done (None: no budget)
        self.end = None if budget_s is None else self.t0 + budget_s + after_s * len(nominal_s)
        #: seconds the end was moved earlier by ``end_hint``
        self.moved_s = 0.0

    def _consult(self) -> None:
        if self.end is None or self.end_hint is None:
            return
        hint = self.end_hint()
        if hint is not None:
            self.end_hint = None  # learnt once
            if hint < self.end:
                self.moved_s = self.end - hint
                self.end = hint

    def stop_by(self, i: int) -> float | None:
        """The ``time.time()`` by which distinct piece ``i`` must be done (None: no budget)."""
        self._consult()
        if self.end is None:
            return None
        return self.end - sum(self.nominal_s[i + 1:]) - self.after_s * (len(self.nominal_s) - i)

    def overrun_s(self) -> float:
        """Seconds past the end so far (0 when within it, or without a budget)."""
        return 0.0 if self.end is None else max(0.0, time.time() - self.end)
