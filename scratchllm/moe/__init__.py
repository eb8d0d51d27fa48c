"""Mixture-of-Experts: the router (router), its auxiliary losses and the selection-bias update
(losses), the experts (SwiGLU, gpt-oss's clamped SwiGLU) and the dispatch that feeds them
(experts), the top-k layer, its weights (MoEWeights) and its Module (layer), and expert-choice
routing (expert_choice). Stands on core and specs (RouterSpec, ExpertsSpec, MoESpec)."""
from .expert_choice import expert_choice_backward, expert_choice_forward
from .experts import (capacity_of, clamped_experts_backward, clamped_experts_forward,
                      clamped_swiglu_backward, clamped_swiglu_forward, dispatch, experts_backward,
                      experts_forward)
from .layer import MoE, MoEOut, MoEWeights, moe_backward, moe_forward, moe_forward_ref
from .losses import (balance_loss_backward, balance_loss_forward, update_selection_bias,
                     z_loss_backward, z_loss_forward)
from .router import (RouterOut, normalise_backward, normalise_forward, router_backward,
                     router_forward, select_topk, selection_margin, topk_margin)

__all__ = [
    "MoE", "MoEOut", "MoEWeights", "RouterOut", "balance_loss_backward", "balance_loss_forward", "capacity_of",
    "clamped_experts_backward", "clamped_experts_forward", "clamped_swiglu_backward",
    "clamped_swiglu_forward",
    "dispatch", "expert_choice_backward", "expert_choice_forward", "experts_backward",
    "experts_forward", "moe_backward", "moe_forward", "moe_forward_ref", "normalise_backward",
    "normalise_forward", "router_backward", "router_forward", "select_topk", "selection_margin",
    "topk_margin", "update_selection_bias", "z_loss_backward", "z_loss_forward",
]
