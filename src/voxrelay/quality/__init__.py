"""Quality metrics of generated speech (speaker similarity, ...)."""
