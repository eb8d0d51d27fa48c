"""Mixture-of-Experts: the router (router), its auxiliary losses and the selection-bias update
(losses: the Switch loss, DeepSeek-V3's per-sequence loss, the z-loss), the experts (SwiGLU,
gpt-oss's clamped SwiGLU, the plain MLP with biases) and the dispatch that feeds them
(experts), the top-k layer, its weights (MoEWeights) and its Module (layer), expert-choice
routing (expert_choice), and fine-grained experts at equal FLOPs (finegrained: split_experts,
merge_experts), and Switch Transformers' top-1 layer with a per-sequence capacity and
its stack's router losses (switch). Stands on core and specs (RouterSpec, ExpertsSpec, MoESpec)."""
from .expert_choice import expert_choice_backward, expert_choice_forward
from .experts import (capacity_of, clamped_experts_backward, clamped_experts_forward,
                      clamped_swiglu_backward, clamped_swiglu_forward, dispatch, experts_backward,
                      experts_forward, mlp_experts_backward, mlp_experts_forward,
                      relu_experts_backward, relu_experts_forward)
from .finegrained import merge_experts, split_experts
from .layer import MoE, MoEOut, MoEWeights, moe_backward, moe_forward, moe_forward_ref
from .losses import (balance_loss_backward, balance_loss_forward,
                     sequence_balance_loss_backward, sequence_balance_loss_forward,
                     update_selection_bias, z_loss_backward, z_loss_forward)
from .switch import (SwitchMoE, SwitchOut, router_losses_backward, router_losses_forward,
                     switch_moe_backward, switch_moe_forward)
from .router import (RouterOut, normalise_backward, normalise_forward, router_backward,
                     router_forward, select_topk, selection_margin, topk_margin)

__all__ = [
    "MoE", "MoEOut", "MoEWeights", "RouterOut", "balance_loss_backward", "balance_loss_forward",
    "capacity_of", "clamped_experts_backward", "clamped_experts_forward",
    "clamped_swiglu_backward", "clamped_swiglu_forward", "dispatch", "expert_choice_backward",
    "expert_choice_forward", "experts_backward", "experts_forward", "merge_experts",
    "mlp_experts_backward", "mlp_experts_forward", "moe_backward", "moe_forward",
    "moe_forward_ref", "normalise_backward", "normalise_forward", "router_backward",
    "router_forward", "select_topk", "selection_margin", "sequence_balance_loss_backward",
    "sequence_balance_loss_forward", "split_experts", "topk_margin", "update_selection_bias",
    "z_loss_backward", "z_loss_forward", "relu_experts_backward", "relu_experts_forward",
    "SwitchMoE", "SwitchOut", "router_losses_backward", "router_losses_forward",
    "switch_moe_backward", "switch_moe_forward",
]
