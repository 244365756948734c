"""The GPT-NeoX-architecture model: layer specs, blocks, attention, and the pipeline wrapper."""
