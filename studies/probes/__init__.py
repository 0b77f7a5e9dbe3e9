"""Study 10: the gradient-level component probes on two real models (``studies.probes.measure`` measures,
``studies.probes.study`` renders the committed results)."""
