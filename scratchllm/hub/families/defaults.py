"""The defaults of transformers' configuration classes for the sub-configs of the
vision-language families. Checkpoints written by transformers 4 keep only the fields of a
nested text_config / vision_config that differ from its class's defaults (llava-hf's LLaVA-1.5:
a text_config of five fields, a CLIP vision_config without hidden_act), so a field absent there
has the value below, as transformers reads it; tests/hub/test_vlm_old_checkpoints.py compares
the table with the classes (tests/fixtures/hf/config_defaults.json, written by
tools/make_hf_fixtures_vlm.py).

Reference: huggingface/transformers src/transformers/models/llama/configuration_llama.py;
huggingface/transformers src/transformers/models/mistral/configuration_mistral.py;
huggingface/transformers src/transformers/models/qwen2/configuration_qwen2.py;
huggingface/transformers src/transformers/models/qwen3/configuration_qwen3.py;
huggingface/transformers src/transformers/models/gemma3/configuration_gemma3.py;
huggingface/transformers src/transformers/models/siglip/configuration_siglip.py;
huggingface/transformers src/transformers/models/clip/configuration_clip.py;
huggingface/transformers src/transformers/models/qwen2_vl/configuration_qwen2_vl.py.
"""
_LM = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
       "num_attention_heads")
_TOWER = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "hidden_act", "layer_norm_eps", "image_size", "patch_size", "num_channels")
NESTED_DEFAULTS = {
    "llama": dict(zip(_LM, (32000, 4096, 11008, 32, 32)), max_position_embeddings=2048),
    "mistral": dict(zip(_LM, (32000, 4096, 14336, 32, 32)), num_key_value_heads=8,
                    max_position_embeddings=131072, sliding_window=4096),
    "qwen2": dict(zip(_LM, (151936, 4096, 22016, 32, 32)), max_position_embeddings=32768),
    "qwen3": dict(zip(_LM, (151936, 4096, 22016, 32, 32)), head_dim=128),
    "gemma3_text": dict(zip(_LM, (262208, 2304, 9216, 26, 8)), num_key_value_heads=4,
                        head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
                        max_position_embeddings=131072, tie_word_embeddings=True),
    "siglip_vision_model": dict(zip(_TOWER, (768, 3072, 12, 12, "gelu_pytorch_tanh", 1e-6,
                                             224, 16, 3))),
    "clip_vision_model": dict(zip(_TOWER, (768, 3072, 12, 12, "quick_gelu", 1e-5, 224, 32, 3))),
    "qwen2_vl_vision": dict(hidden_size=3584, hidden_act="quick_gelu", patch_size=14, depth=32,
                            embed_dim=1280, num_heads=16, mlp_ratio=4, in_channels=3,
                            spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_vl_text": dict(zip(_LM, (152064, 8192, 29568, 80, 64)), num_key_value_heads=8,
                          rms_norm_eps=1e-5, max_position_embeddings=32768),
}


def with_defaults(model_type, sub):
    """A sub-config dict with its class's defaults under the fields it gives."""
    return {**NESTED_DEFAULTS.get(model_type, {}), **sub}
