"""Vision: the patch embedding of an image (a stride-P convolution, equal to a linear map of
flattened patches), the Vision Transformer's input tokens ([CLS] and learned positions), and
the Vision Transformer itself, built from lm's one Block (ViT; SigLIP's vision tower), and
SigLIP's attention-pooling head (a learned probe attends the tokens); and images ->
pixel_values as a checkpoint's image processor makes them (preprocess, NumPy + Pillow); and
the vision-language models, an encoder's features in a decoder LM's input: LLaVA, Qwen2-VL
(its tower on Block with the patch merger, M-RoPE) and the multimodal Gemma 3 (a SigLIP tower,
the pooled projector, bidirectional attention over each image's tokens).

Stands on lm and what lm stands on; hub maps checkpoints onto it."""
from .embed import (VisionEmbedding, VisionEmbedWeights, vision_embed_backward,
                    vision_embed_forward)
from .gemma3 import (Gemma3VL, PoolProjectorWeights, pool_project_backward,
                     pool_project_forward)
from .llava import Llava
from .model import VisionTransformer
from .merger import MergerWeights, patch_merger_backward, patch_merger_forward
from .mrope import image_attention_mask, mrope_positions, vision_positions, vision_rope
from .qwen2_vl import Qwen2VL
from .patch import (ConvWeights, PatchWeights, conv2d_backward, conv2d_forward,
                    patch_embed_backward, patch_embed_forward, patchify, unpatchify)
from .pool import AttentionPool, ProbeWeights, probe_attention_backward, probe_attention_forward
from .preprocess import (image_processor_spec, load_image_processor, open_image, preprocess,
                         preprocess_image, to_rgb)
from .dynamic import flatten_patches, preprocess_patches, smart_resize

__all__ = ["AttentionPool", "ConvWeights", "Gemma3VL", "Llava", "MergerWeights", "PatchWeights",
           "PoolProjectorWeights", "ProbeWeights", "Qwen2VL", "VisionEmbedWeights",
           "VisionEmbedding", "VisionTransformer", "conv2d_backward", "conv2d_forward",
           "flatten_patches", "image_attention_mask", "image_processor_spec",
           "load_image_processor", "mrope_positions", "open_image", "patch_embed_backward",
           "patch_embed_forward", "patch_merger_backward", "patch_merger_forward", "patchify",
           "pool_project_backward", "pool_project_forward", "preprocess", "preprocess_image",
           "preprocess_patches", "probe_attention_backward", "probe_attention_forward",
           "smart_resize", "to_rgb", "unpatchify", "vision_embed_backward", "vision_embed_forward",
           "vision_positions", "vision_rope"]
