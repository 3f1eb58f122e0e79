"""Real-name checkpoint loading, and clear errors for checkpoints that do not match."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from moss_tts.model.checkpoint import CheckpointError
from moss_tts.model.config import ConfigError, MossTTSConfig, real_model_config_dict
from moss_tts.model.loading import build_empty_model, load_model


def test_tiny_checkpoint_has_the_published_names(tiny_dir):
    names = set(load_file(str(tiny_dir / "model" / "model.safetensors")))
    layers = MossTTSConfig.from_pretrained(tiny_dir / "model").backbone.num_hidden_layers
    # 11 tensors per backbone layer + embed/norm + text head + 12 embeddings + 12 heads + stop head + 14 local.
    assert len(names) == layers * 11 + 2 + 1 + 12 + 12 + 1 + 14
    for name in ["transformer.embed_tokens.weight", "transformer.norm.weight",
                 "transformer.layers.0.self_attn.q_norm.weight", "transformer.layers.0.mlp.gate_proj.weight",
                 "audio_embeddings.11.weight", "audio_lm_heads.0.weight", "text_lm_head.weight",
                 "local_text_lm_head.weight", "local_transformer.h.0.attn.c_attn.bias",
                 "local_transformer.h.0.mlp.fc_in.weight", "local_transformer.ln_f.bias"]:
        assert name in names


def test_loaded_weights_equal_the_file(tiny_dir, tiny_model):
    tensors = load_file(str(tiny_dir / "model" / "model.safetensors"))
    state = tiny_model.state_dict()
    assert torch.equal(state["local_transformer.h.0.attn.c_attn.weight"],
                       tensors["local_transformer.h.0.attn.c_attn.weight"])
    assert torch.equal(state["audio_embeddings.3.weight"], tensors["audio_embeddings.3.weight"])


def _copy_with(tiny_dir, tmp_path, edit):
    target = tmp_path / "model"
    shutil.copytree(tiny_dir / "model", target)
    tensors = load_file(str(target / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(target / "model.safetensors"))
    return target


def test_missing_tensor_is_named(tiny_dir, tmp_path):
    target = _copy_with(tiny_dir, tmp_path, lambda t: t.pop("transformer.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor.*layers\.1\.self_attn\.k_norm\.weight"):
        load_model(target)


def test_misshaped_tensor_is_named(tiny_dir, tmp_path):
    def edit(t):
        t["local_text_lm_head.weight"] = torch.zeros(3, t["local_text_lm_head.weight"].shape[1])
    target = _copy_with(tiny_dir, tmp_path, edit)
    with pytest.raises(CheckpointError, match=r"local_text_lm_head\.weight.*shape \(3, 64\)"):
        load_model(target)


def test_unexpected_and_misshaped_tied_copy(tiny_dir, tmp_path):
    target = _copy_with(tiny_dir, tmp_path, lambda t: t.update({"transformer.extra.weight": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*transformer\.extra\.weight"):
        load_model(target)
    target2 = _copy_with(tiny_dir, tmp_path / "b", lambda t: t.update({"audio_lm_heads.4.weight": torch.zeros(1024, 2)}))
    with pytest.raises(CheckpointError, match=r"audio_lm_heads\.4\.weight"):
        load_model(target2)


@pytest.mark.parametrize("field, value, message", [
    ("n_vq", 8, "n_vq must be 12"),
    ("audio_pad_code", 1000, "audio_pad_code"),
    ("local_text_head_mode", "full_vocab", "local_text_head_mode"),
])
def test_config_errors_name_field_and_file(tiny_dir, tmp_path, field, value, message):
    cfg = json.loads((tiny_dir / "model" / "config.json").read_text())
    cfg[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message) as info:
        MossTTSConfig.from_pretrained(tmp_path)
    assert str(path) in str(info.value)


def test_local_width_must_equal_backbone_width():
    cfg = real_model_config_dict()
    cfg["gpt2_config"]["n_embd"] = 1280
    with pytest.raises(ConfigError, match="n_embd.*must equal qwen3_config.hidden_size"):
        MossTTSConfig.from_dict(cfg, "config.json")


def test_real_size_parameter_counts_match_the_spec():
    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    model = build_empty_model(cfg, "meta", torch.bfloat16)
    count = lambda prefix: sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))
    total = sum(p.numel() for p in model.parameters())
    assert abs(count("transformer.") / 4.022e9 - 1) < 0.005
    assert abs(count("local_transformer.") / 76.1e6 - 1) < 0.005
    assert abs(count("audio_embeddings.") / 31.5e6 - 1) < 0.005
    assert abs(total / 4.13e9 - 1) < 0.005
    # With the tied copies the file holds 438 tensors (spec 1.3).
    assert len(model.state_dict()) + 1 + 12 == 438
