"""The NumPy model as ONNX graphs, node by node, each step mirroring the NumPy code it names (graphs/steps.py):
the stacked graph the app serves (graphs/stacked.py), the small graphs a long text runs layer by layer
(graphs/layers.py) with the statistics computed inside them (graphs/reductions.py), and the on-disk cache of
exported graphs (graphs/cache.py)."""
