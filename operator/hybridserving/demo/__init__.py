"""The local demo: a fleet on the SGLang simulator behind the real router, traffic whose mix shifts, a role switch."""
