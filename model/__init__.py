"""Pure numerics: the NumPy reference, ONNX export, onnxruntime runtime and statistics. No web imports."""
