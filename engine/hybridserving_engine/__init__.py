"""What runs inside the engine pods: the launcher and, for tests and demos, the SGLang simulator."""
