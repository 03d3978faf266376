"""The artifact: compressed-tensors and modelopt configs, shard sinks, verification."""
