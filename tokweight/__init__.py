"""tokweight: surprisal-share token weighting for latent-strategy CVAEs."""
