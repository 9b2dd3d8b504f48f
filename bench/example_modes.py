"""The MNIST examples' flags per training mode (`--modes` of bench.mnist_throughput and
bench.multihost_throughput): plain async, sync, and async with the push overlapped."""

MODE_FLAGS = {"async": [], "sync": ["--sync"], "async-overlap": ["--overlap_push"]}
