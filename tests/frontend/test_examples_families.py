"""examples/hf_families.py's helpers: a family's config shrunk by whichever size fields it
has, the fallback to eager attention, left-padded prompts, and a family that fails giving a
one-line row. No compile here: the run itself takes 10-40 s a family on 2 cores."""

import argparse
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import hf_families as F  # noqa: E402


@pytest.mark.parametrize("family, width", [("llama", "hidden_size"), ("gpt2", "n_embd"), ("mixtral", "hidden_size"),
                                           ("falcon", "hidden_size")])  # Falcon derives head_dim: no setter
def test_a_config_is_shrunk_by_its_own_field_names(family, width):
    cfg = F.tiny_config(family)
    assert getattr(cfg, width) == 64 and cfg.vocab_size == 128
    model, attn = F.build(family, "sdpa")
    assert attn == "sdpa" and sum(p.numel() for p in model.parameters()) < 500_000


def test_a_config_that_derives_its_layer_kinds_is_shrunk_too():
    """Mamba's ``layer_types`` is a property of its layer count (no setter): left to follow it."""
    cfg = F.tiny_config("mamba")
    assert cfg.hidden_size == 64 and cfg.num_hidden_layers == 2 and len(cfg.layer_types) == 2
    model, _ = F.build("mamba", "sdpa")  # no attention: built with the eager implementation
    assert sum(p.numel() for p in model.parameters()) < 500_000


def test_a_model_without_sdpa_is_built_with_its_eager_attention(monkeypatch):
    import transformers

    real = transformers.AutoModelForCausalLM.from_config

    def no_sdpa(cfg, attn_implementation):
        if attn_implementation == "sdpa":
            raise ValueError("does not support an attention implementation through sdpa yet")
        return real(cfg, attn_implementation=attn_implementation)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", no_sdpa)
    model, attn = F.build("llama", "sdpa")
    assert attn == "eager" and model.config._attn_implementation == "eager"


def test_prompts_after_the_first_are_left_padded():
    ids, mask = F.inputs(3)
    assert mask[0].all() and not mask[1:, :3].any() and mask[1:, 3:].all()
    assert (ids[1:, :3] == 0).all()


def test_a_family_that_fails_is_a_row_with_its_one_line_error():
    args = argparse.Namespace(batch=1, attn="sdpa", time_limit=1.0, new_tokens=1, timeout=120.0, cache=None,
                              saved=False)
    row = F.run_child("no_such_model_type", args)
    assert set(row) == {"family", "error"} and "no_such_model_type" in row["error"]
    assert "\n" not in row["error"]
    assert "| no_such_model_type |" in F.table([row])


def test_a_hybrid_keeps_a_layer_of_every_kind_it_interleaves():
    cfg = F.tiny_config("qwen3_next")  # linear attention three layers in four, full attention the fourth
    assert set(cfg.layer_types) == {"linear_attention", "full_attention"}
    assert cfg.num_hidden_layers == len(cfg.layer_types) == cfg.layer_types.index("full_attention") + 1


@pytest.mark.parametrize("family", ["gemma4_text", "gemma3n_text"])
def test_sizes_kept_per_layer_are_shrunk_for_every_layer(family):
    """Gemma-4 keeps ``head_dim`` per layer (``hasattr`` on the config raises), Gemma-3n lists
    ``intermediate_size`` one per layer and lets its last layers read earlier layers' caches:
    both shrink, and as many layers make caches as read them, every kind among them."""
    from transformers import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {family}")
    model, _ = F.build(family, "sdpa")
    cfg = model.config
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    sizes = cfg.intermediate_size if isinstance(cfg.intermediate_size, list) else [cfg.intermediate_size]
    assert set(sizes) == {128}
    shared = getattr(cfg, "num_kv_shared_layers", 0) or 0
    if shared:
        assert 2 * shared == cfg.num_hidden_layers
        assert set(cfg.layer_types[:shared]) == set(cfg.layer_types)


def tiny(family: str):
    """``family``'s tiny config, or a skip where this transformers has no such model type."""
    from transformers import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {family}")
    return F.tiny_config(family)


@pytest.mark.parametrize("family, heads, head_dim, expand, groups, chunk", [
    ("mamba2", "num_heads", "head_dim", "expand", "n_groups", "chunk_size"),
    ("bamba", "mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups", "mamba_chunk_size"),
    ("granitemoehybrid", "mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups", "mamba_chunk_size"),
    ("zamba2", "n_mamba_heads", "mamba_headdim", "mamba_expand", "mamba_ngroups", "chunk_size")])
def test_a_mamba2_mixer_keeps_its_heads_fitted_to_the_shrunk_width(family, heads, head_dim, expand, groups, chunk):
    """Defaults of 128 heads of 64 (or 8 of 640) no longer fill ``expand`` × hidden 64: the
    heads are refitted, their groups divide them, and a prompt spans two chunks."""
    cfg = tiny(family)
    n = getattr(cfg, heads)
    assert n * getattr(cfg, head_dim) == getattr(cfg, expand) * cfg.hidden_size == 128
    assert n % getattr(cfg, groups) == 0
    assert getattr(cfg, chunk) == F.SSM_CHUNK < F.inputs(1)[0].shape[1]


@pytest.mark.parametrize("family, layers", [("jamba", 5), ("recurrent_gemma", 3)])
def test_layer_kinds_derived_from_the_layer_count_are_read_before_it_shrinks(family, layers):
    """Jamba's attention layer is the fifth of eight, RecurrentGemma's the third of its pattern:
    both are derived from the layer count, so two layers alone would hold no attention."""
    cfg = tiny(family)
    assert cfg.num_hidden_layers == layers == len(cfg.layer_types)
    assert cfg.layer_types[-1] != "linear_attention" and "linear_attention" in cfg.layer_types


def test_sizes_a_config_derives_follow_the_shrunk_ones():
    """Zamba-2 derives its attention width, Mamba head dim and hybrid layers' indices in
    ``__post_init__``: rebuilt, they follow hidden 64 and seven layers; its head dim, which
    it also takes under the name ``head_dim``, stays as set."""
    cfg = tiny("zamba2")
    assert cfg.attention_hidden_size == 2 * cfg.hidden_size and cfg.kv_channels == 16
    assert cfg.mamba_headdim * cfg.n_mamba_heads == cfg.mamba_expand * cfg.hidden_size
    assert cfg.attention_head_dim == F.TINY["head_dim"]
    assert cfg.hybrid_layer_ids == [i for i, k in enumerate(cfg.layers_block_type) if k == "hybrid"]
    assert len(cfg.layers_block_type) == cfg.num_hidden_layers and cfg.hybrid_layer_ids


@pytest.mark.parametrize("family", ["bamba", "granitemoehybrid"])
def test_a_hybrid_whose_default_has_no_attention_layer_gets_one(family):
    """Bamba lists its attention layers by index, Granite-4 by kind: either way the last layer
    attends, so that ``generate`` can build its causal mask."""
    cfg = tiny(family)
    kinds = getattr(cfg, "layers_block_type", None) or cfg.layer_types
    assert list(kinds) == ["linear_attention", "full_attention"] == list(cfg.layer_types)


def test_a_state_space_model_without_attention_stays_so():
    cfg = tiny("mamba2")
    assert set(cfg.layer_types) == {"linear_attention"} and cfg.num_hidden_layers == 2


def test_a_config_that_leaves_its_layer_kinds_unset_gets_them():
    """LFM2-MoE's default config has no ``layer_types``, which its model indexes per layer."""
    cfg = tiny("lfm2_moe")
    assert cfg.layer_types == ["conv", "full_attention"] and cfg.num_hidden_layers == 2
    assert cfg.num_dense_layers == 1  # the second layer's feed-forward is the experts


def test_lists_one_per_layer_are_cut_to_the_layer_count():
    assert F.per_layer_cut({"a": [1, 2, 3, 4], "b": [5, 6], "c": 7}, 4, 2) == {"a": [1, 2], "b": [5, 6], "c": 7}
    cfg = tiny("gemma3n_text")
    assert len(cfg.activation_sparsity_pattern) == cfg.num_hidden_layers
