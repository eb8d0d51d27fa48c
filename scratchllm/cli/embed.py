"""python -m scratchllm embed [--steps N] [--seed S] [--temperature T] [--lr LR]: train the tiny
embedding model (scratchllm/lm/retrieval.py: a 1-layer bidirectional encoder, mean pooling,
L2 normalisation, symmetric InfoNCE with in-batch negatives) on the synthetic retrieval task
where a query and its document share no token, and print held-out retrieval accuracy before
and after (chance: 1 in 16).

    python -m scratchllm embed                 # 150 steps: accuracy from ~0.06 to 1.0
    python -m scratchllm embed --steps 20      # part way
"""
from scratchllm.cli.common import LR, Parser, float_in, int_at_least, run
from scratchllm.lm.retrieval import N_TOPICS, train_embedder


def build_parser():
    parser = Parser("embed", __doc__)
    parser.add_argument("--steps", type=int_at_least(0), default=150, help="training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float_in(0, 10, open_low=True), default=0.1,
                        help="InfoNCE temperature τ")
    parser.add_argument("--lr", type=LR, default=3e-3, help="AdamW learning rate")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return run("embed", _embed, args)


def _embed(args):
    _, before, after = train_embedder(args.steps, seed=args.seed,
                                      temperature=args.temperature, lr=args.lr)
    print(f"retrieval accuracy on held-out queries ({N_TOPICS} topics, chance "
          f"{1 / N_TOPICS:.3f}): {before:.3f} before, {after:.3f} after {args.steps} steps")
    return 0
