"""The decorator every case module registers its cases with (grads/cases/__init__.py orders
them by topic into CASES), and the loss pair of a whole model of the encoder kinds."""
REGISTERED = {}  # name -> case function, in the order the modules were imported


def case(fn):
    """Register fn under its name."""
    if fn.__name__ in REGISTERED:
        raise ValueError(f"grads case {fn.__name__!r} is registered twice")
    REGISTERED[fn.__name__] = fn
    return fn


def module_loss_pair(model, *data, **options):
    """model.loss(*data, **options) as a pair over the model's Params (as lm.loss_pair does
    for the LM): (forward(**arrays), backward(dloss, cache), {name: array})."""
    params = dict(model.named_parameters())

    def forward(**arrays):
        for name, p in params.items():
            p.data = arrays[name]
        return model.loss(*data, **options)

    def backward(dloss, cache):
        model.zero_grad()
        model.loss_backward(float(dloss), cache)
        return {name: p.grad.copy() for name, p in params.items()}

    return forward, backward, {name: p.data for name, p in params.items()}
