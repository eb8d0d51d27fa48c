"""The Hugging Face families, one record (base.Family) each, grouped by kind: dense (llama,
mistral, qwen2, qwen3, gemma3_text), gpt2, moe (mixtral, deepseek_v3), gpt_oss, ssm (mamba,
jamba); base holds what they share. hub/registry.py lists them."""
