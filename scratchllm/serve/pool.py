"""Where a serving engine keeps keys and values: a paged pool (fixed-size blocks addressed
through BlockManager's block tables) or one contiguous array per sequence, either in the
model's dtype or quantised (int8, fp8, int4: quantize.py, one group per token per head).

Each layer keeps its own streams per token (cache_layers): a full causal GQA layer its keys
and values, (Hkv, Dh) each; an MLA layer one latent [kv_norm(c_kv) | k_pe] (1, Dc + dr),
what its absorbed decoding form reads (DeepSeek-V2, arXiv 2405.04434), quantised in groups of
gcd(Dc, dr) numbers so that no scale spans both the latent and the rope key.
Both caches give the LM's decode what an attention layer's own state gives it (views.py:
GroupState for GQA, LatentView for MLA), a view of a group of sequences. So LM.prefill and
LM.decode run unchanged on a paged or quantised cache: append quantises and scatters each
token into its slot, reading gathers (and dequantises) the group's tokens.

    paged pool of a layer   codes (n_blocks, heads, bs, Wc), scales (n_blocks, heads, bs, G)
    contiguous              codes (1, heads, max_len, Wc) per sequence (as KVState)
(heads = Hkv or 1; W = Dh or Dc + dr; Wc = W, or W / 2 for int4; G groups per vector; no
scales unquantised.)

Glossary: B sequences in a group, Hkv KV heads, Dh head dim, Dc KV latent, dr rope dim,
L tokens held, bs block size.
"""
from math import gcd
from typing import NamedTuple

import numpy as np

from scratchllm.attention import MLA, Attention
from scratchllm.serve.blocks import BlockManager
from scratchllm.serve.quantize import FORMATS, default_group_size, dequantize_codes, quantize
from scratchllm.serve.views import GroupState, KernelView, LatentView

KV_DTYPES = ("float32",) + FORMATS  # "float32": unquantised, in the model's own dtype


def attention_layers(model):
    """(Hkv, Dh) of each layer, checking every mixer is full causal GQA attention (what the
    eviction and quality tools read; windows, MLA and recurrent mixers keep other states)."""
    return [_gqa_layer(i, layer.mixer, "full causal GQA attention layers")
            for i, layer in enumerate(model.layers)]


def _gqa_layer(i, mixer, what):
    """(Hkv, Dh) of layer i's mixer, a ValueError naming what it is unless full causal GQA."""
    mask = getattr(getattr(mixer, "spec", None), "mask", None)
    if type(mixer) is not Attention or mask.window is not None or mask.block is not None \
            or mask.chunk is not None:  # chunks: Llama 4's local layers
        raise ValueError(f"serve: layer {i} is {type(mixer).__name__}"
                         f"{' with a window' if mask is not None and mask.window else ''}"
                         f"{' with chunks' if mask is not None and mask.chunk else ''}; "
                         f"the serving caches hold {what} only")
    if mixer.spec.alibi:
        raise ValueError(f"serve: layer {i} uses ALiBi; the serving caches need RoPE or "
                         f"learned positions")
    return mixer.spec.n_kv_heads, mixer.head_dim


class CacheLayer(NamedTuple):
    """What a serving cache keeps per token of one layer: `streams` vectors of (heads, width)
    numbers, quantised in groups of `group` (None: default_group_size)."""
    kind: str  # "gqa" (streams k, v) or "mla" (one stream: [kv_norm(c_kv) | k_pe])
    streams: int  # 2 or 1
    heads: int  # Hkv or 1
    width: int  # Dh or Dc + dr
    group: int = None  # MLA: gcd(Dc, dr), so no group spans both parts
    split: int = None  # MLA: Dc, where the latent ends and k_pe begins


def cache_layers(model):
    """The CacheLayer of each layer, checking every mixer is full causal GQA attention or MLA
    without DeepSeek-V3.2's indexer (its index keys are a third stream, not kept here)."""
    out = []
    for i, layer in enumerate(model.layers):
        mixer = layer.mixer
        if type(mixer) is MLA:
            spec = mixer.spec
            if spec.indexer is not None:
                raise ValueError(f"serve: layer {i} is MLA with DeepSeek-V3.2's indexer; the "
                                 f"serving caches hold its latents but not its index keys")
            Dc, dr = spec.kv_lora_rank, spec.qk_rope_head_dim
            out.append(CacheLayer("mla", 1, 1, Dc + dr, gcd(Dc, dr), Dc))
        else:
            hkv, dh = _gqa_layer(i, mixer, "full causal GQA or MLA attention layers")
            out.append(CacheLayer("gqa", 2, hkv, dh))
    return out


def paged_supported(model):
    """Whether the paged and quantised caches can hold this model (cache_layers)."""
    try:
        cache_layers(model)
    except ValueError:
        return False
    return True


def make_views(cache, seqs, length):
    """Per-layer views of `seqs` (each holding `length` tokens) for LM.decode: a GroupState
    for a GQA layer (a KernelView on a quantised PagedCache with kernel=True), a LatentView
    for an MLA layer."""
    gqa = KernelView if getattr(cache, "kernel", False) else GroupState
    return [LatentView(cache, i, seqs, length) if layer.kind == "mla" else
            gqa(cache, i, seqs, length) for i, layer in enumerate(cache.layers)]


class _Codec:
    """How one cache stores a (..., W) vector: codes (..., Wc) and scales (..., G), in groups
    of `group` numbers (None: default_group_size; int4 takes at most 32)."""

    def __init__(self, fmt, width, dtype, group=None):
        if fmt not in KV_DTYPES:
            raise ValueError(f"serve: kv_dtype must be one of {KV_DTYPES}, got {fmt!r}")
        self.fmt, self.dtype = fmt, np.dtype(dtype)
        if group is None:
            group = default_group_size(fmt, width)
        elif fmt == "int4":
            group = gcd(group, 32)
        self.group = group
        if fmt == "int4" and group % 2:
            raise ValueError(f"serve: int4 packs two values per byte; a group of {group} of "
                             f"the {width} numbers per vector is odd")
        self.code_dim = width // 2 if fmt == "int4" else width
        self.n_groups = width // self.group
        self.code_dtype = {"float32": self.dtype, "int8": np.int8, "int4": np.uint8,
                           "fp8": np.dtype(quantize(np.zeros(1), "fp8").codes.dtype)}[fmt]

    def empty(self, lead):
        """Zeroed (codes, scales) of leading shape `lead` (scales None unquantised)."""
        codes = np.zeros(lead + (self.code_dim,), self.code_dtype)
        return codes, (None if self.fmt == "float32" else np.zeros(lead + (self.n_groups,),
                                                                  np.float32))

    def encode(self, x):
        """x (..., Dh) -> (codes, scales)."""
        if self.fmt == "float32":
            return x, None
        q = quantize(x, self.fmt, group_size=self.group)
        return q.codes, q.scales

    def decode(self, codes, scales):
        if self.fmt == "float32":
            return codes
        return dequantize_codes(codes, scales, self.fmt, self.group, self.dtype)


class PagedCache:
    """Every layer's block pool and the one BlockManager they share; kernel: a quantised
    pool's GQA layers attend in qattention's kernel (reading the codes) instead of
    dequantising first, in LM.decode on its views (KernelView), decode_rows and one-token
    forward_rows (off by default: no speed-up measured yet)."""
    batchable = True

    def __init__(self, model, n_blocks, block_size, kv_dtype="float32", kernel=False):
        self.kernel = kernel and kv_dtype != "float32"
        self.layers = cache_layers(model)
        self.blocks = BlockManager(n_blocks, block_size)
        self.codecs = [_Codec(kv_dtype, c.width, model.dtype, c.group) for c in self.layers]
        self.pools = [[codec.empty((n_blocks, c.heads, block_size)) for _ in range(c.streams)]
                      for codec, c in zip(self.codecs, self.layers)]  # [layer][stream] (codes, scales)

    def views(self, seqs, length):
        """Per-layer views of `seqs` (each holding `length` tokens) for LM.decode."""
        return make_views(self, seqs, length)

    def copy_blocks(self, copies):
        """Copy-on-write: block src -> dst in every layer's pools."""
        for src, dst in copies:
            for pair in self.pools:
                for codes, scales in pair:
                    codes[dst] = codes[src]
                    if scales is not None:
                        scales[dst] = scales[src]

    def write(self, layer, seqs, starts, *streams):
        """The layer's streams (k, v (B, Hkv, t, Dh); MLA's latent (B, 1, t, Dc + dr)) of
        sequence seqs[b] at positions starts[b] .. + t - 1."""
        B, _, t, _ = streams[0].shape
        where = [w for seq, p in zip(seqs, starts) for w in self.blocks.slots(seq, int(p), t)]
        blk = np.array([w[0] for w in where])  # (B*t,)
        off = np.array([w[1] for w in where])  # (B*t,)
        for (codes, scales), x in zip(self.pools[layer], streams):
            c, s = self.codecs[layer].encode(x.transpose(0, 2, 1, 3))  # (B, t, heads, Wc | G)
            codes[blk, :, off] = c.reshape((B * t,) + c.shape[2:])  # (B*t, heads, Wc)
            if scales is not None:
                scales[blk, :, off] = s.reshape((B * t,) + s.shape[2:])  # (B*t, heads, G)

    def table(self, seqs, L):
        """The block tables of seqs for their first L tokens, (B, nb) ints; a shorter table is
        padded with its first block (entries past a row's length are never read as its)."""
        nb = self.blocks.blocks_for(L)
        tables = [self.blocks.tables[s][:nb] for s in seqs]
        return np.array([t + t[:1] * (nb - len(t)) for t in tables])  # (B, nb)

    def read(self, layer, seqs, lengths):
        """The layer's streams of seqs[b]'s first lengths[b] tokens: keys and values (B, Hkv,
        max length, Dh) each, or (MLA) the latents (B, 1, max length, Dc + dr) alone, in a
        tuple; a row past its own length holds padding (another block's entries)."""
        L = int(max(lengths))
        table = self.table(seqs, L)  # (B, nb)
        out = []
        for codes, scales in self.pools[layer]:
            c = _gather(codes, table, L)  # (B, heads, L, Wc)
            s = None if scales is None else _gather(scales, table, L)  # (B, heads, L, G)
            out.append(self.codecs[layer].decode(c, s))  # (B, heads, L, W)
        return tuple(out)


def _gather(pool, table, length):
    """pool (n_blocks, Hkv, bs, X) at block table (B, nb) -> (B, Hkv, length, X)."""
    B, nb = table.shape
    g = pool[table]  # (B, nb, Hkv, bs, X)
    g = g.transpose(0, 2, 1, 3, 4).reshape(B, pool.shape[1], nb * pool.shape[2], -1)
    return g[:, :, :length]  # (B, Hkv, L, X)


class ContiguousCache:
    """One preallocated (1, heads, max_len, .) array per stream, sequence and layer, as KVState
    (LatentKVState) holds: the memory a server without paging reserves for a request's whole output."""
    batchable = True

    def __init__(self, model, kv_dtype="float32"):
        self.layers = cache_layers(model)
        self.codecs = [_Codec(kv_dtype, c.width, model.dtype, c.group) for c in self.layers]
        self.arrays = {}  # seq -> [layer][stream] (codes, scales)

    def add(self, seq, max_len):
        self.arrays[seq] = [[codec.empty((1, c.heads, max_len)) for _ in range(c.streams)]
                            for codec, c in zip(self.codecs, self.layers)]

    def release(self, seq):
        del self.arrays[seq]

    def views(self, seqs, length):
        return make_views(self, seqs, length)

    def write(self, layer, seqs, starts, *streams):
        """The layer's streams (PagedCache.write's) of sequence seqs[b] at positions
        starts[b] .. + t - 1."""
        t = streams[0].shape[2]
        for b, (seq, p) in enumerate(zip(seqs, starts)):
            for (codes, scales), x in zip(self.arrays[seq][layer], streams):
                c, s = self.codecs[layer].encode(x[b:b + 1])  # (1, heads, t, Wc | G)
                codes[:, :, p:p + t] = c
                if scales is not None:
                    scales[:, :, p:p + t] = s

    def read(self, layer, seqs, lengths):
        """The layer's streams (PagedCache.read's) of seqs[b]'s first lengths[b] tokens; a
        row past its own length holds padding."""
        L = int(max(lengths))
        out = []
        for j in range(self.layers[layer].streams):  # k, v; or the latent
            parts = [self.arrays[seq][layer][j] for seq in seqs]
            c = _stack([p[0] for p in parts], L)  # (B, heads, L, Wc)
            s = None if parts[0][1] is None else _stack([p[1] for p in parts], L)
            out.append(self.codecs[layer].decode(c, s))  # (B, heads, L, W)
        return tuple(out)

    def nbytes(self):
        """Bytes the sequences now held reserve (codes and scales of every layer)."""
        return sum(a.nbytes for layers in self.arrays.values() for pair in layers
                   for codes_scales in pair for a in codes_scales if a is not None)


class StateCache:
    """Each request's own decoding states from model.init_state(1, max_len) (any mixer:
    sliding windows, MLA with an indexer, Mamba's and the recurrences' states): the contiguous
    cache of a model the paged pool cannot hold. Its requests cannot share a decode call."""
    batchable = False

    def __init__(self, model):
        self.model, self.states = model, {}

    def add(self, seq, max_len):
        self.states[seq] = self.model.init_state(1, max_len)

    def release(self, seq):
        del self.states[seq]

    def views(self, seqs, length):
        """The one request's states (length: what it holds, checked by the LM's decode)."""
        if len(seqs) != 1:
            raise ValueError(f"StateCache.views: one request per call, got {len(seqs)}")
        return self.states[seqs[0]]

    def nbytes(self):
        """Bytes of every held state (KVState and its kin, or a tuple of arrays)."""
        return sum(st.nbytes if hasattr(st, "nbytes") else sum(a.nbytes for a in st)
                   for states in self.states.values() for st in states)


def _stack(arrays, L):
    """The first L tokens of each (1, Hkv, max_len, X) array, stacked: (B, Hkv, L, X); an
    array shorter than L is zero-padded; one array alone comes back as a view."""
    if len(arrays) == 1 and arrays[0].shape[2] >= L:
        return arrays[0][:, :, :L]
    out = np.zeros((len(arrays), arrays[0].shape[1], L, arrays[0].shape[3]), arrays[0].dtype)
    for b, a in enumerate(arrays):
        n = min(L, a.shape[2])
        out[b, :, :n] = a[0, :, :n]
    return out
