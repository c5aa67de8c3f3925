"""Any Hugging Face causal LM under torch.compile(backend="mugraph"), checked against eager:
a tiny random-weight configuration of each named ``model_type`` (two layers, hidden 64), a
prompt's logits and a greedy ``generate`` over transformers' static cache, each family in a
child process of its own (docs/models.md, "Beyond the tested families").

Where ``tests/frontend/test_models.py`` pins nine families' decoder layers, this reaches
every architecture transformers ships a config for: its sizes are shrunk by the config
fields they go by (``hidden_size`` or ``n_embd``, ``num_attention_heads`` or ``n_head``,
…, whichever the config has), the sizes a config derives are derived again, and nothing is
downloaded. Nothing model-specific is written here but the layer kinds of a config that
leaves them unset (:data:`UNSET_LAYER_KINDS`). A family whose model transformers cannot
build with SDPA attention is built with its eager attention (the softmax written out, as
the model's own code spells it).

    python examples/hf_families.py gpt2 falcon mixtral --out /tmp/families.json
    python examples/hf_families.py llama --batch 2 --attn eager      # left padding; eager attention
    python examples/hf_families.py gpt2 olmo --saved                  # also through saved compiles

Each row: the largest logit difference over the largest logit (the prompt's forward pass,
no cache), whether ``generate``'s greedy tokens equal eager's, how many of the pieces the
backend cut (all graphs, both compiles) run as μGraphs, and the seconds each compile and
run took on this machine; a failure is its one-line error. On a CPU the μGraphs are the
cost model's picks, run under Triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _layers import error_line  # noqa: E402

#: the families run when none are named: every one checked for docs/models.md's table
DEFAULT_FAMILIES = ("gpt2", "gpt_neox", "gptj", "falcon", "bloom", "opt", "gemma2", "gemma3_text", "cohere",
                    "stablelm", "granite", "qwen3_moe", "mixtral", "olmo", "mpt", "codegen", "persimmon",
                    "nemotron", "exaone4", "helium", "smollm3", "glm4", "qwen2_moe", "deepseek_v3",
                    "hunyuan_v1_dense", "ernie4_5", "seed_oss", "apertus", "arcee", "cohere2", "olmo3", "gpt_oss", "qwen3_next",
                    "xglm", "starcoder2", "gpt_bigcode", "phi", "llama", "mistral", "qwen2", "phi3")

#: config fields set where the config has them: two layers of hidden 64, 4 query and 2
#: key/value heads of dim 16, a 128-token vocabulary; experts, low-rank attention, partial
#: rotary dims and state-space sizes cut to match
#: the names a config gives its layer count
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")

TINY = {
    **dict.fromkeys(LAYER_FIELDS, 2),
    "hidden_size": 64, "n_embd": 64, "d_model": 64,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "ffn_hidden_size": 128,
    "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 256, "n_positions": 256,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "shared_intermediate_size": 64,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "num_dense_layers": 1, "n_group": 1, "topk_group": 1,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": 32,
    "global_head_dim": 16, "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16,
    "rotary_dim": 8, "tie_word_embeddings": False, "pad_token_id": 0,
    # state-space layers: the state per channel, the rank of the time step's projection (as
    # the configs' "auto" gives it, hidden / 16) and a recurrence as wide as the model
    "state_size": 16, "mamba_d_state": 16, "ssm_state_size": 16,
    "time_step_rank": 4, "mamba_dt_rank": 4, "lru_width": 64,
}


class SsmFields(NamedTuple):
    """The names one config gives a Mamba-2 mixer's sizes: its heads times their dim must
    equal its inner width (``expand`` times the hidden size, or ``inner`` where the config
    gives that width itself), and its groups of B/C projections must divide its heads."""

    heads: str
    head_dim: str
    expand: str
    groups: str
    chunk: str
    inner: str | None = None


#: the Mamba-2 mixer's sizes under each set of names transformers' configs use, the first
#: set a config has all three sizes of being its own
SSM_FIELDS = (
    SsmFields("mamba_num_heads", "mamba_head_dim", "expand", "n_groups", "chunk_size"),
    SsmFields("mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups", "mamba_chunk_size", "mamba_d_ssm"),
    SsmFields("n_mamba_heads", "mamba_headdim", "mamba_expand", "mamba_ngroups", "chunk_size"),
    # last: plain names, which a config with the prefixed ones may give its attention
    SsmFields("num_heads", "head_dim", "expand", "n_groups", "chunk_size"),
)

#: a Mamba-2 mixer's chunk: half the prompt (:func:`inputs`), so that the prompt's scan
#: carries its state across a chunk boundary as a long prompt's does
SSM_CHUNK = 4

#: the fields a config lists its attention layers' indices in, where its ``layer_types`` is
#: derived from them
ATTENTION_INDEX_FIELDS = ("attn_layer_indices",)

#: layer kinds for a config that leaves ``layer_types`` unset although its model reads one
#: kind per layer (transformers' default config of these cannot build its model). The kinds'
#: names are the model's own (its code tests for them), so no config field can give them:
#: one layer of each kind the published checkpoints interleave.
UNSET_LAYER_KINDS = {"lfm2_moe": ["conv", "full_attention"]}


def tiny_config(model_type: str):
    """``model_type``'s default config with :data:`TINY`'s sizes wherever it has those fields,
    enough layers for every kind it interleaves, its state-space heads fitted to the new width,
    and every size its ``__post_init__`` derives from these derived again."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    before, derived = layer_count(cfg), derived_fields(cfg)
    # read before the layer count shrinks: a config may derive its kinds from that count
    # (Jamba's attention layer comes fifth in a period of eight)
    kinds = with_attention(cfg, layer_kinds(cfg) or UNSET_LAYER_KINDS.get(model_type))
    listed = set_sizes(cfg)
    if kinds:
        fit_layer_kinds(cfg, kinds)
    for k in listed:
        setattr(cfg, k, [TINY[k]] * layer_count(cfg))
    if hasattr(cfg, "kv_lora_rank"):  # latent attention: each query head has keys and values of its own
        cfg.num_key_value_heads = cfg.num_attention_heads
    fit_ssm_heads(cfg)
    return derived_again(cfg, derived, before)


def layer_count(cfg) -> int:
    """The config's number of layers, under whichever name it gives it."""
    return next((getattr(cfg, k) for k in LAYER_FIELDS if hasattr(cfg, k)), TINY["num_hidden_layers"])


def layer_kinds(cfg) -> list | None:
    """The config's kind of each layer (``layer_types``, stored or derived), or None."""
    kinds = getattr(cfg, "layer_types", None)
    return list(kinds) if isinstance(kinds, (list, tuple)) and kinds else None


def with_attention(cfg, kinds: list | None) -> list | None:
    """``kinds``; but where a config that sizes attention heads makes every layer a linear
    (state-space) one, :data:`TINY`'s layer count of them with the last one full attention:
    the published hybrids interleave attention layers (Bamba's and Granite-4's default configs
    leave them out), and transformers cannot build ``generate``'s causal mask over a cache
    that has no attention layer."""
    if kinds and set(kinds) == {"linear_attention"} and hasattr(cfg, "num_attention_heads"):
        return ["linear_attention"] * (TINY["num_hidden_layers"] - 1) + ["full_attention"]
    return kinds


def set_sizes(cfg) -> list[str]:
    """Set :data:`TINY`'s sizes the config has; the names of those it lists one per layer
    (Gemma-3n's ``intermediate_size``), left for the caller to set once the layer count is known."""
    # sizes a config keeps per layer (Gemma-4's head_dim) are set for all layers at once but
    # cannot be read globally: ``hasattr`` raises there
    per_layer = set(getattr(cfg, "per_layer_attributes", None) or ())
    listed = []
    for k, v in TINY.items():
        if k in per_layer or hasattr(cfg, k):
            if k not in per_layer and isinstance(getattr(cfg, k), (list, tuple)):
                listed.append(k)
                continue
            try:
                setattr(cfg, k, v)
            except AttributeError:  # a size the config derives (Falcon's head_dim): it follows the others
                pass
    return listed


def fit_layer_kinds(cfg, kinds: list) -> None:
    """Enough layers to hold every kind in ``kinds`` (a hybrid's full-attention layer may come
    fourth: two linear-attention layers alone are another model), the kinds cut to them."""
    n = max(TINY["num_hidden_layers"], max(kinds.index(k) for k in set(kinds)) + 1)
    # last layers that read earlier layers' caches (Gemma-3n, Gemma-4): as many again, so
    # that the layers making caches still hold every kind
    shared = getattr(cfg, "num_kv_shared_layers", 0) or 0
    if shared:
        cfg.num_kv_shared_layers = n
        n *= 2
    for k in LAYER_FIELDS:
        if hasattr(cfg, k):
            setattr(cfg, k, n)
    kinds = (kinds * n)[:n]  # repeated where the layers outnumber the kinds given
    try:
        cfg.layer_types = kinds
    except AttributeError:  # derived: from the layer count and a pattern (Mamba's, Jamba's), or from
        for k in ATTENTION_INDEX_FIELDS:  # the attention layers' indices (Bamba's), set from the kinds
            if hasattr(cfg, k):
                setattr(cfg, k, [i for i, kind in enumerate(kinds) if kind == "full_attention"] or None)


def fit_ssm_heads(cfg) -> None:
    """A Mamba-2 mixer's heads fitted to the shrunk width: heads of :data:`TINY`'s head dim
    (as many as the inner width holds), groups dividing them, chunks of :data:`SSM_CHUNK`."""
    import math

    f = next((f for f in SSM_FIELDS if all(hasattr(cfg, k) for k in (f.heads, f.head_dim, f.expand))), None)
    if f is None:
        return
    inner = int(getattr(cfg, f.expand) * cfg.hidden_size)
    if f.inner and getattr(cfg, f.inner, None) is not None:
        setattr(cfg, f.inner, inner)
    heads = max(1, inner // TINY["head_dim"])
    while inner % heads:
        heads -= 1
    setattr(cfg, f.heads, heads)
    setattr(cfg, f.head_dim, inner // heads)
    if hasattr(cfg, f.groups):
        setattr(cfg, f.groups, math.gcd(getattr(cfg, f.groups), heads))
    if hasattr(cfg, f.chunk):
        setattr(cfg, f.chunk, SSM_CHUNK)


def derived_fields(cfg) -> set[str]:
    """What the config holds that is none of its class's fields nor a field's other name
    (``attribute_map``: Qwen3-MoE keeps ``num_experts`` as ``num_local_experts``): sizes and
    lists its ``__post_init__`` derives from the fields (Zamba-2's attention width, Mamba's
    inner width, Gemma-4's per-layer head dims)."""
    import dataclasses

    return set(cfg.to_dict()) - {f.name for f in dataclasses.fields(cfg)} - set(cfg.attribute_map.values())


def derived_again(cfg, derived: set[str], before: int):
    """The config built again from its fields, with what it ``derived`` left out for its
    ``__post_init__`` to derive from the shrunk fields (a saved config would set the stale
    values again: Zamba-2's attention width of 5120, its hybrid layers past the seventh), and
    the class's own checks run on the result. Lists one per layer of its ``before`` layers are
    cut to the layers it has (:func:`per_layer_cut`)."""
    fields = {k: v for k, v in cfg.to_dict().items() if k not in derived}
    return type(cfg).from_dict(per_layer_cut(fields, before, layer_count(cfg)))


def per_layer_cut(fields: dict, before: int, layers: int) -> dict:
    """``fields`` with every list of ``before`` entries, one per layer of the default config
    (Gemma-3n's activation sparsity), cut to the first ``layers``: a rebuilt config checks
    that such a list has an entry per layer, no more."""
    if layers >= before:
        return fields
    return {k: v[:layers] if isinstance(v, list) and len(v) == before else v for k, v in fields.items()}


def build(model_type: str, attn: str, seed: int = 0):
    """``(model, attention)``: the tiny random-weight causal LM in eval mode, with ``attn``
    attention where transformers builds it so, else with its eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(model_type)
    try:
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval(), attn
    except ValueError:  # "does not support an attention implementation through ... yet"
        return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval(), "eager"


def inputs(batch: int, length: int = 8, seed: int = 0):
    """``(input_ids, attention_mask)``: random prompts; from the second row on, the first three
    positions are left padding (masked), as a batched ``generate`` pads."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 120, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1:, :3] = 0
    ids[1:, :3] = 0
    return ids, mask


def check(model_type: str, batch: int, attn: str, time_limit: float, new_tokens: int,
          cache: str | None = None, saved: bool = False) -> dict:
    """One family's row (run in this process): the prompt's logits and greedy tokens, under
    the backend (its result cache in ``cache``; None: the backend's default) and eagerly;
    with ``saved``, also through a saved compile and its load (:func:`check_saved`)."""
    import torch

    from mugraph.frontend import recent_graphs  # importing registers the backend

    row: dict = {"family": model_type, "batch": batch}
    model, row["attention"] = build(model_type, attn)
    ids, mask = inputs(batch)
    opts = {"time_limit": time_limit, **({"cache_dir": cache} if cache else {})}
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, use_cache=False).logits
        t0 = time.perf_counter()
        got = torch.compile(model, backend="mugraph", options=opts)(ids, attention_mask=mask, use_cache=False).logits
        row["prompt_s"] = round(time.perf_counter() - t0, 1)
        # positions all of whose keys are padding are not compared: what a model returns there is its own affair
        seen = mask.bool()
        row["logits_rel_err"] = float((got - ref)[seen].abs().max() / ref[seen].abs().max())
        torch._dynamo.reset()
        greedy = dict(max_new_tokens=new_tokens, do_sample=False, cache_implementation="static", pad_token_id=0)
        expected = model.generate(ids, attention_mask=mask, **greedy)
        model.forward = torch.compile(model.forward, backend="mugraph", options=opts)
        t0 = time.perf_counter()
        tokens = model.generate(ids, attention_mask=mask, **greedy)
        row["generate_s"] = round(time.perf_counter() - t0, 1)
        row["tokens_equal"] = bool(torch.equal(expected, tokens))
    pieces = [bp for c in recent_graphs() for cap in c.captured.values() for bp in cap.pieces]
    row["pieces"] = len(pieces)
    row["pieces_mugraph"] = sum(bp.info.get("runs") == "mugraph" for bp in pieces)
    if saved:
        row.update(check_saved(model_type, attn, ids, mask, greedy, expected, opts))
    return row


def check_saved(model_type: str, attn: str, ids, mask, greedy: dict, expected, opts: dict) -> dict:
    """``generate`` through a saved compile (``mugraph.frontend.saved_forward``): compiled and
    saved, then — dynamo reset, the backend's memo forgotten, the model built again — loaded
    from the files without a trace; whether each run's tokens equal eager's, and whether every
    signature of the second came from a file. A failure is its one-line error."""
    import tempfile

    import torch

    from mugraph.core.errors import first_line
    from mugraph.frontend import run, saved_forward

    out: dict = {}
    folder = tempfile.mkdtemp(prefix=f"saved-{model_type}-")
    try:
        for phase in ("saved", "loaded"):
            torch._dynamo.reset()
            run.forget()
            model, _ = build(model_type, attn)
            with torch.no_grad():
                model.forward = saved_forward(model, folder, opts)
                t0 = time.perf_counter()
                tokens = model.generate(ids, attention_mask=mask, **greedy)
            out[f"{phase}_s"] = round(time.perf_counter() - t0, 1)
            out[f"{phase}_tokens_equal"] = bool(torch.equal(expected, tokens))
            hows = [i["how"] for i in model.forward.info.values()]
            out[f"{phase}_how"] = ", ".join(sorted(set(hows)))
    except Exception as e:  # noqa: BLE001 - a family whose forward cannot be saved says why
        out["saved_error"] = first_line(e, 240)
    return out


def run_child(model_type: str, args) -> dict:
    """:func:`check` in a child process (dynamo's and the backend's state start fresh), its row
    or its one-line error; stopped after ``args.timeout`` seconds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model_type, "--batch", str(args.batch),
           "--attn", args.attn, "--time-limit", str(args.time_limit), "--new-tokens", str(args.new_tokens)]
    if args.cache:
        cmd += ["--cache", args.cache]
    if args.saved:
        cmd += ["--saved"]
    try:  # the child sets TRITON_INTERPRET itself (main), before anything imports triton
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"family": model_type, "error": f"stopped after {args.timeout:g} s"}
    last = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    if p.returncode == 0 and last:
        return json.loads(last[0])
    return {"family": model_type, "error": error_line(p.stderr) or f"exit code {p.returncode}"}


def saved_cell(r: dict) -> str:
    """A row's saved-compile column: tokens equal when compiled and saved, and when loaded
    (with how the loaded run's signatures came), or the error."""
    if "saved_error" in r:
        return r["saved_error"]
    if "saved_tokens_equal" not in r:
        return ""
    yes = {True: "yes", False: "**no**"}
    return (f"{yes[r['saved_tokens_equal']]}, {yes[r['loaded_tokens_equal']]} ({r['loaded_how']}; "
            f"{r['saved_s']:g}, {r['loaded_s']:g} s)")


def saved_ok(r: dict) -> bool:
    """Whether a row's saved compile (if it was asked for) generated eager's tokens both times,
    the second from its files alone."""
    if "saved_error" in r:
        return False
    return "saved_tokens_equal" not in r or (r["saved_tokens_equal"] and r["loaded_tokens_equal"]
                                             and r["loaded_how"] == "loaded")


def table(rows: list[dict]) -> str:
    saved = any("saved_tokens_equal" in r or "saved_error" in r for r in rows)
    extra = (" saved compile: tokens equal (saved, loaded) |", "---|") if saved else ("", "")
    lines = ["| family | attention | batch | logits rel. err | greedy tokens equal | pieces: μGraph / all "
             "| compile + run s (prompt, generate) |" + extra[0], "|---|---|---|---|---|---|---|" + extra[1]]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | | | {r['error']} | | | |" + (" |" if saved else ""))
            continue
        lines.append(f"| {r['family']} | {r['attention']} | {r['batch']} | {r['logits_rel_err']:.1e} "
                     f"| {'yes' if r['tokens_equal'] else '**no**'} | {r['pieces_mugraph']} / {r['pieces']} "
                     f"| {r['prompt_s']:g}, {r['generate_s']:g} |" + (f" {saved_cell(r)} |" if saved else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", default=list(DEFAULT_FAMILIES), help="transformers model_type names")
    ap.add_argument("--batch", type=int, default=1, help="prompts (from the second on, left-padded)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    ap.add_argument("--time-limit", type=float, default=1.0, help="the backend's search seconds a piece")
    ap.add_argument("--new-tokens", type=int, default=3, help="greedy tokens generated")
    ap.add_argument("--timeout", type=float, default=600.0, help="a family is stopped after this many s")
    ap.add_argument("--cache", default=None, help="the backend's result cache (default: its own; a new folder "
                    "for cold compiles)")
    ap.add_argument("--saved", action="store_true", help="also generate through a saved compile, then from "
                    "its files in a fresh state (mugraph.frontend.saved_forward)")
    ap.add_argument("--out", default=None, help="write the rows here (JSON)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        print(json.dumps(check(args.child, args.batch, args.attn, args.time_limit, args.new_tokens, args.cache,
                                args.saved)))
        return 0
    rows = []
    for f in args.families:
        rows.append(run_child(f, args))
        print(json.dumps(rows[-1]), flush=True)
    print()
    print(table(rows))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all("error" not in r and r["tokens_equal"] and saved_ok(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
