"""tuner: find the fastest parallel configuration for Megatron-LM / DeepSpeed training."""
