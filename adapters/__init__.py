"""Framework adapters (TensorFlow's cross-device ops, PyTorch's DDP)."""
