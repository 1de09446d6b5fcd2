"""The NumPy transformer, and nothing else: functional ops, masks, attention, blocks and stacks under one config,
weights in flat state-dict names, and the teaching models built from the same modules by hand. The reference every
other path (the ONNX graphs, onnxruntime) is tested against."""
