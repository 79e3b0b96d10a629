"""Framework adapters (TensorFlow's cross-device ops)."""
