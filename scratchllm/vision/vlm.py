"""What the vision-language models (llava.py, qwen2_vl.py) share: a decoder LM (self.lm) whose
input embedding has image features in the places of the image tokens.

    x_0 = E[input_ids];  x_0[image] = p     forward (each model makes its p)
    dp = dx_0[image];  dE <- dx_0 with the image rows zeroed    backward
"""
import numpy as np

from scratchllm.core.nn import Module


class ImageTokensLM(Module):
    """A Module whose Params include an LM at self.lm fed image features at image tokens;
    PROJECTOR: the name prefixes of its projector's Params; IMAGE_AROUND: the text its
    checkpoints' processor writes before and after each image's ids."""
    PROJECTOR = ("proj",)
    IMAGE_AROUND = ("", "")

    @property
    def dtype(self):
        return self.lm.dtype

    def named_buffers(self):
        return [(f"lm.{n}", b) for n, b in self.lm.named_buffers()]

    def projector_parameters(self):
        """[(name, Param)] of the projector between the image encoder and the LM (the class's
        PROJECTOR prefixes): what LLaVA's stage 1 (feature alignment) trains alone."""
        return [(n, p) for n, p in self.named_parameters() if n.startswith(self.PROJECTOR)]

    def place_features(self, x, image, p):
        """x (B, T, D) embeddings, image (B, T) bool, p (Bi, n, D) features of Bi images (or
        (n_image_tokens, D), counted already) -> x with the image rows replaced, in order (a
        copy). A ValueError naming the model when the image tokens and features differ."""
        if p.ndim == 3:
            if image.sum() != p.shape[0] * p.shape[1]:
                raise ValueError(f"{type(self).__name__}: input_ids hold {int(image.sum())} "
                                 f"image tokens ({self.cfg.image_token_id}); {p.shape[0]} "
                                 f"image(s) give {p.shape[0] * p.shape[1]} features")
            p = p.reshape(-1, p.shape[2])  # (Bi*n, D)
        x = x.copy()
        x[image] = p  # (B, T, D)
        return x

    def check_extras(self, input_ids, attention_mask=None, marks=None, name="mm_token_type_ids"):
        """The extra inputs transformers' processors give, which add nothing here: an
        attention_mask of all ones (padding is not implemented), and marks (B, T) nonzero at
        exactly the image tokens (Qwen2-VL's mm_token_type_ids, Gemma 3's token_type_ids)."""
        fn = f"{type(self).__name__}.forward"
        if attention_mask is not None and not np.all(np.asarray(attention_mask) == 1):
            raise ValueError(f"{fn}: attention_mask with padding (zeros) is not implemented; "
                             f"give rows of equal length (or all ones)")
        if marks is not None and not np.array_equal(
                np.asarray(marks) != 0, np.asarray(input_ids) == self.cfg.image_token_id):
            raise ValueError(f"{fn}: {name} must be nonzero at exactly the image tokens "
                             f"({self.cfg.image_token_id}) of input_ids")

    def split_grad(self, dx, image):
        """The backward of place_features: dx (B, T, D) -> (dp (n_image_tokens, D), dx of the
        embedding: the image rows zeroed, which the embedding lost)."""
        return dx[image], np.where(image[..., None], 0, dx)


class ImageBound:
    """A vision-language model with its images bound: prefill(ids, state) is the model's
    prefill with them (the decoding loops of lm/sampling.py call prefill(ids, state));
    everything else is the model's own."""

    def __init__(self, model, inputs):
        self.model, self.inputs = model, inputs

    def __getattr__(self, name):
        return getattr(self.model, name)

    def prefill(self, ids, state):
        return self.model.prefill(ids, state, **self.inputs)


def image_block(image_token_id, n, brackets=(None, None), around=((), ())):
    """The prompt ids one image stands for: its n image tokens, between the checkpoint's
    start and end ids when it has them (Qwen2-VL's <|vision_start|> ... <|vision_end|>,
    Gemma 3's <start_of_image> ... <end_of_image>; LLaVA has none), and the ids of the text
    its processor writes around them (`around`: Gemma 3's "\n\n" each side)."""
    start, end = brackets
    return list(around[0]) + ([] if start is None else [start]) + [image_token_id] * n + \
        ([] if end is None else [end]) + list(around[1])
