"""Parallelism across processes on MPI (mpi4py + MPICH, the `dist` extra): process groups on a
rank grid (comm, grid), the collectives as forward/backward pairs (collectives), data
parallelism's bucketed gradient all-reduce (data_parallel), ZeRO-1's sharded AdamW (zero),
ZeRO-2/3's per-block reduce-scatter of gradients and all-gather of weights (zero_layers) and
Megatron's column/row-parallel Linear and vocab-parallel pairs (tensor_parallel) and ring
attention (ring_attention, context parallelism). Stands on core. Importing this
package does not start MPI; `Group.world()` does."""
from .collectives import (AllToAllCache, GroupCache, ShiftCache, all_gather_backward,
                          all_gather_forward, all_reduce_backward, all_reduce_forward,
                          all_to_all_backward, all_to_all_forward, copy_to_group_backward,
                          copy_to_group_forward, pipeline_hop_backward,
                          pipeline_hop_forward, reduce_from_group_backward,
                          reduce_from_group_forward, reduce_scatter_backward,
                          reduce_scatter_forward, ring_shift_backward, ring_shift_forward)
from .comm import INSTALL, Group, MPIUnavailable, SelfComm, launched_by_mpiexec, mpi
from .data_parallel import BUCKET_BYTES, all_reduce_grads, bucket_plan, buckets, bytes_per_step
from .grid import AXES, GridError, GridShape, RankGrid, check_shape, coords_of
from .tensor_parallel import (ColumnCache, RowCache, VocabCECache, VocabEmbedCache,
                              column_linear_backward, column_linear_forward,
                              row_linear_backward, row_linear_forward, split_columns,
                              split_rows, vocab_cross_entropy_backward,
                              vocab_cross_entropy_forward, vocab_embedding_backward,
                              vocab_embedding_forward)
from .ring_attention import (RingCache, ring_attention_backward, ring_attention_forward,
                             ring_positions)
from .zero import ZeroAdamW, partition
from .zero_layers import ShardedModel, ZeroUnit

__all__ = ["AXES", "AllToAllCache", "BUCKET_BYTES", "ColumnCache", "GridError", "GridShape",
           "Group", "GroupCache", "INSTALL", "MPIUnavailable", "RankGrid", "RowCache",
           "SelfComm", "ShardedModel", "ShiftCache", "ZeroAdamW", "ZeroUnit",
           "all_gather_backward", "all_gather_forward", "all_reduce_backward", "all_reduce_forward", "all_reduce_grads",
           "all_to_all_backward", "all_to_all_forward", "bucket_plan", "buckets",
           "bytes_per_step", "check_shape", "column_linear_backward", "column_linear_forward",
           "coords_of", "copy_to_group_backward", "copy_to_group_forward",
           "launched_by_mpiexec", "mpi", "partition", "pipeline_hop_backward",
           "pipeline_hop_forward", "reduce_from_group_backward",
           "reduce_from_group_forward", "reduce_scatter_backward", "reduce_scatter_forward",
           "ring_shift_backward", "ring_shift_forward", "row_linear_backward",
           "row_linear_forward", "split_columns", "split_rows", "VocabCECache",
           "VocabEmbedCache", "vocab_cross_entropy_backward", "vocab_cross_entropy_forward",
           "vocab_embedding_backward", "vocab_embedding_forward", "RingCache",
           "ring_attention_backward", "ring_attention_forward", "ring_positions"]
