"""What the LM's decode sees of a serving cache (pool.py): one layer's view of a group of
sequences, with the protocol of that layer's own decoding state, so LM.prefill and LM.decode
run unchanged on a paged or quantised cache.

    GroupState   a GQA layer's, as KVState: append(k, v), kv(), positions(), key_mask()
    KernelView   a GroupState of a quantised PagedCache made with kernel=True: also
                 attend(q, scale, softcap, sinks), which gqa_decode calls instead of kv() and
                 sdpa, reading the codes in qattention's kernel (no dequantised copy)
    LatentView   an MLA layer's, as LatentKVState (attention/kv_state.py): append(ckv, k_pe)
                 one token, latents (B, L, Dc + dr) = [kv_norm(c_kv) | k_pe], kv, pe,
                 key_mask(); latent_width = Dc + dr is what mla_decode checks
Both keep each sequence's length (n_seen: an int while the rows are in step, else (B,)), and
append writes (quantising) into each sequence's slots, reading gathers (and dequantises).

Glossary: B sequences in a group, Hkv KV heads, Dh head dim, L tokens held, Dc KV latent,
dr rope dim.
"""
import numpy as np

from scratchllm.serve.qattention import QUANTIZED_PAGED_ATTENTION, ScoreOptions


class GroupState:
    """One layer's KVState-like view of sequences `seqs` holding `lengths` tokens (an int for
    all, or (B,) ints: rows at different lengths, as KVState's rows may be)."""

    def __init__(self, cache, layer, seqs, lengths):
        self.cache, self.layer, self.seqs = cache, layer, seqs
        self.lengths = np.broadcast_to(np.asarray(lengths, np.int64), (len(seqs),)).copy()

    @property
    def length(self):
        return int(self.lengths.max())

    @property
    def n_seen(self):
        """An int while the rows are in step, else the (B,) lengths."""
        same = (self.lengths == self.lengths[0]).all()
        return int(self.lengths[0]) if same else self.lengths.copy()

    def restart(self, rows):
        """Rows (a (B,) bool mask or indices) start new sequences: they hold nothing."""
        self.lengths[rows] = 0

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) at positions lengths[b] .. + t - 1 of each sequence."""
        self.cache.write(self.layer, self.seqs, self.lengths, k, v)
        self.lengths += k.shape[2]

    def kv(self):
        """The group's keys and values, (B, Hkv, max length, Dh) each (dequantised)."""
        return self.cache.read(self.layer, self.seqs, self.lengths)

    def positions(self):
        return np.arange(self.length)  # (length,)

    def key_mask(self):
        """None while the rows are in step, else (B, 1, 1, length) bool: key j of row b is
        one of its tokens (j < lengths[b])."""
        if np.ndim(self.n_seen) == 0:
            return None
        return (np.arange(self.length) < self.lengths[:, None])[:, None, None, :]


class KernelView(GroupState):
    """A GroupState whose decode attention runs in qattention's kernel on the pool's codes."""

    def attend(self, q, scale, softcap, sinks):
        """q (B, H, 1, Dh) against every row's first lengths[b] tokens -> o (B, H, 1, Dh)."""
        cache, codec = self.cache, self.cache.codecs[self.layer]
        o, _ = QUANTIZED_PAGED_ATTENTION.forward(
            q[:, :, 0], *cache.pools[self.layer], cache.table(self.seqs, self.length),
            self.lengths, fmt=codec.fmt, group_size=codec.group,
            scores=ScoreOptions(scale, softcap, sinks))  # (B, H, Dh)
        return o[:, :, None]  # (B, H, 1, Dh)


class LatentView(GroupState):
    """One MLA layer's LatentKVState-like view: the cache keeps [kv_norm(c_kv) | k_pe] as one
    (1, Dc + dr) stream per token."""

    def __init__(self, cache, layer, seqs, lengths):
        super().__init__(cache, layer, seqs, lengths)
        self.kv_lora_rank = cache.layers[layer].split  # Dc
        self.latent_width = cache.layers[layer].width  # Dc + dr

    def append(self, ckv, k_pe):
        """Store one token per sequence: ckv (B, Dc), k_pe (B, dr)."""
        lat = np.concatenate([ckv, k_pe], axis=-1)  # (B, Dc+dr)
        self.cache.write(self.layer, self.seqs, self.lengths, lat[:, None, None])
        self.lengths += 1

    @property
    def latents(self):
        """Every row's latents, (B, max length, Dc + dr) (dequantised; a shorter row's slots
        past its length are padding: key_mask())."""
        return self.cache.read(self.layer, self.seqs, self.lengths)[0][:, 0]

    @property
    def kv(self):
        """kv_norm(c_kv) of the held tokens, (B, L, Dc)."""
        return self.latents[..., :self.kv_lora_rank]

    @property
    def pe(self):
        """The roped shared keys of the held tokens, (B, L, dr)."""
        return self.latents[..., self.kv_lora_rank:]
