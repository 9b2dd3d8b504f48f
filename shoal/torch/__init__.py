"""`shoal.torch`: a PyTorch program on Shoal's parameter servers in a few changed lines.

    import shoal.torch
    shoal.torch.add_flags(parser, os.environ)        # the cluster flags, --sync, --model_dir ...
    job = shoal.torch.init(args, os.environ)         # a ps serves here and exits; with no cluster,
                                                     # an in-process ps (plain `python train.py`)
    loader = DataLoader(data, batch_size=100, sampler=shoal.torch.DistributedSampler(data, job))
    opt = shoal.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job)
    ...  # the usual loop: opt.zero_grad(); loss.backward(); opt.step(); lr schedulers work
    opt.finish()                                     # final checkpoint (chief), tell the ps

`init`, `add_flags` and `Job` load without torch, so a ps task never imports it; the
optimizer and the sampler import torch on first use. See docs/pytorch.md.
"""

from shoal.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    "shoal.torch.job": ("Job", "init"),
    "shoal.torch.flags": ("add_flags",),
    "shoal.torch.errors": ("TorchTrainError",),
    "shoal.torch.optimizer": ("DistributedOptimizer", "ParameterServerOptimizer"),
    "shoal.torch.sampler": ("DistributedSampler",),
    "shoal.torch.leased_sampler": ("LeasedSampler",),
    "shoal.torch.leased_batch_sampler": ("LeasedBatchSampler",),
})
