"""Limits shared across layers."""

# auto's largest tree, and the largest size calibration times (costs.curve.BATCH_SIZES ends with
# it), so every tree it weighs is priced from a measurement. gemma Q4_K_M: 80 tokens cost 2.46 ms
# each, 64 cost 2.50; with chains of up to 80 loop tokens 30 Spec-Bench prompts were modelled 0.6%
# faster, 30 others the same.
AUTO_NODES = 80
